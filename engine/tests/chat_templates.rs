//! Chat-template parity (spec §6.1): every rendering of `fixtures/chat/cases.json`, made by
//! transformers' own jinja2 renderer, must come out byte-identical. Plus the file's chat
//! bundle and tokenizer on the reference fixtures.

mod common;

use std::collections::HashMap;

use common::fixture;
use cortiq_engine::chat::{
    ChatBundle, ChatError, ChatTemplate, EosOrigin, RenderOptions, TemplateOrigin, Tokenizer,
    CHATML_TEMPLATE,
};
use cortiq_engine::format::CmfModel;
use serde_json::{json, Value};

/// Where two renderings part, with a little context on each side.
fn diff_hint(expected: &str, got: &str) -> String {
    let at = expected
        .bytes()
        .zip(got.bytes())
        .position(|(a, b)| a != b)
        .unwrap_or(expected.len().min(got.len()));
    let window = |s: &str| {
        let lo = at.saturating_sub(40);
        let hi = (at + 40).min(s.len());
        String::from_utf8_lossy(&s.as_bytes()[lo..hi]).into_owned()
    };
    format!(
        "first difference at byte {at} (expected {} bytes, got {}):\n    expected …{:?}…\n    got      …{:?}…",
        expected.len(),
        got.len(),
        window(expected),
        window(got)
    )
}

#[test]
fn all_cases_render_byte_identically() {
    let dir = fixture("chat");
    let text = std::fs::read_to_string(dir.join("cases.json")).expect("read cases.json");
    let cases: Vec<Value> = serde_json::from_str(&text).expect("cases.json is a JSON array");
    assert_eq!(cases.len(), 192, "cases.json should hold 192 cases");

    let mut templates: HashMap<String, ChatTemplate> = HashMap::new();
    let mut failures = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let name = case["template"]
            .as_str()
            .expect("case.template is a string");
        let template = templates.entry(name.to_string()).or_insert_with(|| {
            let src = std::fs::read_to_string(dir.join(name))
                .unwrap_or_else(|e| panic!("read template {name}: {e}"));
            ChatTemplate::new(&src).unwrap_or_else(|e| panic!("{name} does not compile: {e}"))
        });
        let opts = RenderOptions {
            add_generation_prompt: case["add_generation_prompt"]
                .as_bool()
                .expect("case.add_generation_prompt is a bool"),
            tools: Some(case["tools"].clone()).filter(|t| !t.is_null()),
            extra: case["extra"].as_object().cloned().unwrap_or_default(),
            ..RenderOptions::default()
        };
        let label = format!(
            "#{i} {name} / {} / tools={} / add_generation_prompt={} / extra={}",
            case["conversation"].as_str().unwrap_or("?"),
            !case["tools"].is_null(),
            opts.add_generation_prompt,
            case["extra"]
        );
        let got = template.render(&case["messages"], &opts);
        match (&case["expected"], &case["error"], got) {
            (Value::String(expected), _, Ok(got)) => {
                if *expected != got {
                    failures.push(format!("{label}: {}", diff_hint(expected, &got)));
                }
            }
            (_, Value::String(err), Ok(got)) => failures.push(format!(
                "{label}: expected the error {err:?}, rendered {got:?}"
            )),
            (_, Value::String(_), Err(_)) => {}
            (_, _, Err(e)) => failures.push(format!("{label}: render failed: {e}")),
            (other, _, Ok(_)) => failures.push(format!("{label}: bad case, expected = {other}")),
        }
    }
    assert_eq!(templates.len(), 4, "the cases cover four templates");
    assert!(
        failures.is_empty(),
        "{} of {} cases differ from transformers:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn file_template_is_bytes_of_the_header() {
    // The qwen3 fixture carries the ChatML-with-default-system template of chat/chatml.jinja.
    let model = CmfModel::open(fixture("cmf/qwen3-q8.cmf")).expect("open qwen3-q8.cmf");
    let bundle = ChatBundle::from_model(&model).expect("chat bundle");
    assert_eq!(bundle.template_origin(), TemplateOrigin::File);
    assert!(!bundle.is_fallback());
    let chatml = std::fs::read_to_string(fixture("chat/chatml.jinja")).unwrap();
    assert_eq!(bundle.template().source(), chatml.trim_end_matches('\n'));
    assert_eq!(bundle.eos_token_ids(), &[2]);
    assert_eq!(bundle.eos_origin(), EosOrigin::File);
    assert!(bundle.is_eos(2) && !bundle.is_eos(1));
    assert_eq!(bundle.pad_token_id(), Some(0));
    assert_eq!(bundle.bos_token_id(), None);
    assert_eq!(bundle.bos_token(), None);
    assert_eq!(bundle.eos_token(), Some("<|im_end|>"));

    let messages = json!([{"role": "user", "content": "Hello, мир!"}]);
    let opts = RenderOptions {
        add_generation_prompt: true,
        ..RenderOptions::default()
    };
    let prompt = bundle.render_chat(&messages, &opts).unwrap();
    assert_eq!(
        prompt,
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHello, мир!<|im_end|>\n<|im_start|>assistant\n"
    );
    let ids = bundle.encode_prompt(&prompt).unwrap();
    // The special tokens are single ids: <|im_start|> = 1, <|im_end|> = 2.
    assert_eq!(ids[0], 1);
    assert_eq!(ids.iter().filter(|&&i| i == 1).count(), 3);
    assert_eq!(ids.iter().filter(|&&i| i == 2).count(), 2);
    assert!(ids.iter().all(|&i| (i as usize) < 512));
    let tok = bundle.tokenizer().expect("the fixture has a tokenizer");
    assert_eq!(tok.decode(&ids, false).unwrap(), prompt);
    assert_eq!(
        tok.decode(&ids, true).unwrap(),
        "system\nYou are a helpful assistant.\nuser\nHello, мир!\nassistant\n"
    );
}

#[test]
fn bundle_without_config_falls_back_to_chatml() {
    let json = std::fs::read(fixture("hf/qwen3/tokenizer.json")).unwrap();
    let bundle = ChatBundle::from_parts(Some(&json), None).unwrap();
    assert!(bundle.is_fallback());
    assert_eq!(bundle.template().source(), CHATML_TEMPLATE);
    // No listed stop ids: the tokenizer's own end tokens, in FALLBACK_EOS_TOKENS order.
    assert_eq!(bundle.eos_origin(), EosOrigin::Tokenizer);
    assert_eq!(bundle.eos_token_ids(), &[2, 0]); // <|im_end|>, <|endoftext|>
    let out = bundle
        .render_chat(
            &json!([{"role": "user", "content": "Hi"}]),
            &RenderOptions {
                add_generation_prompt: true,
                ..RenderOptions::default()
            },
        )
        .unwrap();
    assert_eq!(
        out,
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );

    // No tokenizer at all: rendering works, encoding says why it cannot.
    let bare = ChatBundle::from_parts(None, None).unwrap();
    assert!(bare.eos_token_ids().is_empty());
    assert!(matches!(
        bare.encode_prompt("x"),
        Err(ChatError::NoTokenizer)
    ));
}

#[test]
fn tokenizer_round_trip_and_streaming() {
    let json = std::fs::read(fixture("hf/qwen3/tokenizer.json")).unwrap();
    let tok = Tokenizer::from_bytes(&json).unwrap();
    assert_eq!(tok.vocab_size(), 512);
    assert_eq!(tok.token_to_id("<|im_end|>"), Some(2));
    assert_eq!(tok.id_to_token(1).as_deref(), Some("<|im_start|>"));
    assert!(tok.is_special(0) && !tok.is_special(300));

    let text = "Привет, 世界! naïve café — 😀 done";
    let ids = tok.encode(text, false).unwrap();
    assert_eq!(tok.decode(&ids, false).unwrap(), text);

    let mut stream = tok.stream(false);
    let mut out = String::new();
    let mut held = 0;
    for &id in &ids {
        match stream.step(id).unwrap() {
            Some(piece) => {
                assert!(
                    !piece.contains('\u{FFFD}'),
                    "a piece split a character: {piece:?}"
                );
                out.push_str(&piece);
            }
            None => held += 1,
        }
    }
    assert_eq!(stream.finish().unwrap(), None);
    assert_eq!(out, text);
    // With 512 tokens the CJK characters and the emoji span several byte-level ids.
    assert!(
        held > 0,
        "expected at least one id that completes no character"
    );

    // A stream cut inside a character hands over the rest (as U+FFFD) at the end.
    let emoji = tok.encode("😀", false).unwrap();
    assert!(emoji.len() > 1);
    let mut stream = tok.stream(false);
    assert_eq!(stream.step(emoji[0]).unwrap(), None);
    assert_eq!(stream.finish().unwrap().as_deref(), Some("\u{FFFD}"));
}

#[test]
fn bad_tokenizer_json_is_an_error() {
    assert!(matches!(
        Tokenizer::from_bytes(b"{\"not\": \"a tokenizer\"}"),
        Err(ChatError::Tokenizer(_))
    ));
}

#[test]
fn chat_types_can_move_to_worker_threads() {
    // Generation runs on a worker thread (the TUI's Elm loop): the bundle must go along.
    fn send_sync<T: Send + Sync>() {}
    send_sync::<ChatBundle>();
    send_sync::<ChatTemplate>();
    send_sync::<Tokenizer>();
}
