//! End-to-end tests of `cortiq prompt` on the reference fixture `qwen3-q8.cmf`, whose chat
//! bundle carries the ChatML-with-default-system template of `fixtures/chat/chatml.jinja`.

#[macro_use]
mod common;
use common::{code, json};

use std::path::{Path, PathBuf};

use serde_json::Value;

fn model() -> PathBuf {
    common::shared("fixtures/cmf/qwen3-q8.cmf")
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8(o.stdout.clone()).expect("stdout is UTF-8")
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

const USER_HI: &str = r#"[{"role": "user", "content": "Hi there, мир"}]"#;
const EXPECTED: &str = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi there, мир<|im_end|>\n<|im_start|>assistant\n";

#[test]
fn prints_exactly_the_rendered_prompt() {
    let dir = tempfile::tempdir().unwrap();
    let m = write(dir.path(), "m.json", USER_HI);
    let o = run!("prompt", model(), "--messages", m);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(stdout(&o), EXPECTED);

    let o = run!("prompt", model(), "--messages", m, "--no-generation-prompt");
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        EXPECTED.strip_suffix("<|im_start|>assistant\n").unwrap()
    );

    // The {"messages": [...]} form renders the same.
    let wrapped = write(
        dir.path(),
        "w.json",
        &format!(r#"{{"messages": {USER_HI}}}"#),
    );
    assert_eq!(
        stdout(&run!("prompt", model(), "--messages", wrapped)),
        EXPECTED
    );
}

#[test]
fn ids_in_text_and_json() {
    let dir = tempfile::tempdir().unwrap();
    let m = write(dir.path(), "m.json", USER_HI);
    let o = run!("prompt", model(), "--messages", m, "--ids", "--json");
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let v = json(&o);
    assert_eq!(v["prompt"], EXPECTED);
    assert_eq!(v["template"], "file");
    assert_eq!(v["eos_token_ids"], serde_json::json!([2]));
    let ids: Vec<u64> = v["ids"]
        .as_array()
        .expect("ids is an array")
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    assert_eq!(ids[0], 1, "<|im_start|> is id 1");
    assert_eq!(ids.iter().filter(|&&i| i == 2).count(), 2, "two <|im_end|>");
    assert!(ids.iter().all(|&i| i < 512));

    // Text: the prompt, then the same ids on one line.
    let o = run!("prompt", model(), "--messages", m, "--ids");
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let text = stdout(&o);
    let (prompt, line) = text[..text.len() - 1].rsplit_once('\n').unwrap();
    assert_eq!(format!("{prompt}\n"), EXPECTED);
    let listed: Vec<u64> = line.split(',').map(|s| s.parse().unwrap()).collect();
    assert_eq!(listed, ids);
}

#[test]
fn custom_template_tools_and_vars() {
    let qwen3 = common::shared("fixtures/chat/qwen3.jinja");
    let cases: Vec<Value> = serde_json::from_str(
        &std::fs::read_to_string(common::shared("fixtures/chat/cases.json")).unwrap(),
    )
    .unwrap();
    // A qwen3 case with tools, a generation prompt and enable_thinking=false.
    let case = cases
        .iter()
        .find(|c| {
            c["template"] == "qwen3.jinja"
                && c["conversation"] == "tool_call"
                && !c["tools"].is_null()
                && c["add_generation_prompt"] == true
                && c["extra"]["enable_thinking"] == false
        })
        .expect("cases.json has a qwen3 tool-call case without thinking");
    let dir = tempfile::tempdir().unwrap();
    let m = write(dir.path(), "m.json", &case["messages"].to_string());
    let t = write(dir.path(), "t.json", &case["tools"].to_string());
    let o = run!(
        "prompt",
        model(),
        "--messages",
        m,
        "--tools",
        t,
        "--template",
        qwen3,
        "--var",
        "enable_thinking=false",
        "--json"
    );
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let v = json(&o);
    assert_eq!(v["prompt"], case["expected"]);
    assert_eq!(v["template"], "path");
    assert!(v["prompt"]
        .as_str()
        .unwrap()
        .ends_with("<think>\n\n</think>\n\n"));
}

#[test]
fn input_errors_are_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    let bad = write(dir.path(), "bad.json", "[{\"role\": ");
    let o = run!("prompt", model(), "--messages", bad);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("not valid JSON"), "{}", stderr(&o));

    let o = run!(
        "prompt",
        model(),
        "--messages",
        dir.path().join("missing.json")
    );
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("missing.json"), "{}", stderr(&o));

    let obj = write(dir.path(), "obj.json", r#"{"role": "user"}"#);
    assert_eq!(code(&run!("prompt", model(), "--messages", obj)), 2);

    let m = write(dir.path(), "m.json", USER_HI);
    let o = run!(
        "prompt",
        model(),
        "--messages",
        m,
        "--var",
        "novalue",
        "--json"
    );
    assert_eq!(code(&o), 2);
    assert_eq!(json(&o)["error"]["kind"], "Usage");

    let broken = write(dir.path(), "broken.jinja", "{% for m in %}");
    assert_eq!(
        code(&run!(
            "prompt",
            model(),
            "--messages",
            m,
            "--template",
            broken
        )),
        2
    );

    let o = run!("prompt", dir.path().join("nope.cmf"), "--messages", m);
    assert_eq!(code(&o), 2);
}

#[test]
fn raise_exception_exits_1_with_the_message() {
    let dir = tempfile::tempdir().unwrap();
    let m = write(
        dir.path(),
        "m.json",
        r#"[{"role": "assistant", "content": "x"}]"#,
    );
    let t = write(
        dir.path(),
        "strict.jinja",
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('Conversations must start with a user message') }}{% endif %}ok",
    );
    let o = run!(
        "prompt",
        model(),
        "--messages",
        m,
        "--template",
        t,
        "--json"
    );
    assert_eq!(code(&o), 1);
    let v = json(&o);
    assert_eq!(v["ok"], false);
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("Conversations must start with a user message"));
    assert!(stderr(&o).contains("Conversations must start with a user message"));
}
