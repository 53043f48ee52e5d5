//! A chat template comes with the model file, so it is hostile input: each template here
//! would loop for hours or allocate gigabytes without the bounds of `chat::template`, and
//! must instead stop with `ChatError::Limit` naming the bound it hit. A long benign
//! conversation still renders with every fixture template.

mod common;

use common::fixture;
use cortiq_engine::chat::template::{
    fuel_budget, FUEL, MAX_OUTPUT_BYTES, MAX_RANGE_ITEMS, MAX_STRING_BYTES,
};
use cortiq_engine::chat::{ChatError, ChatTemplate, RenderOptions};
use serde_json::{json, Value};

/// Renders `src` over one user message and expects a limit error that names `limit`.
fn assert_limit(src: &str, limit: &str) {
    let t = ChatTemplate::new(src).unwrap_or_else(|e| panic!("{src}: {e}"));
    let messages = json!([{"role": "user", "content": "hi"}]);
    match t.render(&messages, &RenderOptions::default()) {
        Err(ChatError::Limit(msg)) => {
            assert!(msg.contains(limit), "{src}: {msg:?} does not name {limit}");
            let shown = ChatError::Limit(msg).to_string();
            assert!(shown.contains("limit"), "{shown}");
        }
        Err(other) => panic!("{src}: expected ChatError::Limit, got {other:?}"),
        Ok(out) => panic!("{src}: rendered {} bytes", out.len()),
    }
}

#[test]
fn nested_loops_run_out_of_fuel() {
    assert_limit(
        "{% for i in range(100000) %}{% for j in range(100000) %}{{ '' }}{% endfor %}{% endfor %}",
        "FUEL",
    );
}

#[test]
fn indent_by_a_huge_width_is_refused_before_allocating() {
    assert_limit("{{ 'a' | indent(10**10) }}", "FUEL");
    assert_limit("{{ 'a\nb\nc' | indent(10**10, true) }}", "FUEL");
    assert_limit("{{ 'a' | indent(width=10**10) }}", "FUEL");
}

#[test]
fn string_repetition_is_refused_before_allocating() {
    assert_limit("{{ ' ' * 10**10 }}", "FUEL");
    assert_limit("{{ 'a' * 10**10 }}", "FUEL");
    assert_limit("{{ 10**10 * 'ab' }}", "FUEL");
}

#[test]
fn a_string_doubled_in_a_loop_stops_at_the_fuel() {
    assert_limit(
        "{% set ns = namespace(s='a') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}",
        "FUEL",
    );
    // The same through macro recursion, with no namespace to carry it.
    assert_limit(
        "{% macro d(s, n) %}{% if n %}{{ d(s ~ s, n - 1) }}{% else %}{{ s | length }}{% endif %}{% endmacro %}{{ d('a', 40) }}",
        "FUEL",
    );
}

#[test]
fn output_is_bounded() {
    // 100 kB printed 10^5 times would be 10 GB of prompt.
    assert_limit(
        "{% set big = 'x' * 100000 %}{% for i in range(100000) %}{{ big }}{% endfor %}",
        "MAX_OUTPUT_BYTES",
    );
}

#[test]
fn range_is_bounded() {
    assert_limit(
        "{% for i in range(10**10) %}{% endfor %}",
        "MAX_RANGE_ITEMS",
    );
    assert_limit("{{ range(0, 10**12, 3) | length }}", "MAX_RANGE_ITEMS");
    // The bound is exact, and within it range is minijinja's (and Python's).
    assert_limit(
        &format!("{{{{ range({}) | length }}}}", MAX_RANGE_ITEMS + 1),
        "MAX_RANGE_ITEMS",
    );
    let t = ChatTemplate::new(&format!("{{{{ range({MAX_RANGE_ITEMS}) | length }}}}")).unwrap();
    let out = t.render(&json!([]), &RenderOptions::default()).unwrap();
    assert_eq!(out, MAX_RANGE_ITEMS.to_string());
    let t = ChatTemplate::new("{{ range(5) | list }}{{ range(10, 0, -3) | list }}").unwrap();
    let out = t.render(&json!([]), &RenderOptions::default()).unwrap();
    assert_eq!(out, "[0, 1, 2, 3, 4][10, 7, 4, 1]");
}

/// A list holding the previous one twice, 40 times over: 40 small lists to build,
/// 2^40 items to print.
const SHARED: &str = "{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = [ns.l, ns.l] %}{% endfor %}";

#[test]
fn printing_a_shared_structure_is_bounded() {
    assert_limit(&format!("{SHARED}{{{{ ns.l }}}}"), "MAX_STRING_BYTES");
    assert_limit(
        &format!("{SHARED}{{{{ ns.l | tojson }}}}"),
        "MAX_STRING_BYTES",
    );
    assert_limit(
        &format!("{SHARED}{{{{ ns.l | string }}}}"),
        "MAX_STRING_BYTES",
    );
    assert_limit(
        &format!("{SHARED}{{{{ '{{}}'.format(ns.l) }}}}"),
        "MAX_STRING_BYTES",
    );
}

#[test]
fn deep_or_cyclic_values_are_not_printed() {
    assert_limit(
        "{% set ns = namespace(l=[1]) %}{% for i in range(1000) %}{% set ns.l = [ns.l] %}{% endfor %}{{ ns.l }}",
        "MAX_NESTING",
    );
    // A namespace that holds itself.
    assert_limit(
        "{% set ns = namespace() %}{% set ns.me = ns %}{{ ns | tojson }}",
        "MAX_NESTING",
    );
}

#[test]
fn widths_that_pad_by_a_huge_number_are_refused() {
    assert_limit("{{ [1, 2] | tojson(indent=10**10) }}", "MAX_STRING_BYTES");
    assert_limit("{{ '{:>10000000000}'.format('x') }}", "MAX_STRING_BYTES");
    assert_limit("{{ '{:>{}}'.format('x', 10**10) }}", "MAX_STRING_BYTES");
    assert_limit("{{ '%10000000000s' | format('x') }}", "FUEL");
    // Ordinary widths still format.
    let t = ChatTemplate::new("{{ '{:>5}|{:<3}|{:^7}'.format('a', 'b', 'c') }}").unwrap();
    let out = t.render(&json!([]), &RenderOptions::default()).unwrap();
    assert_eq!(out, "    a|b  |   c   ");
}

/// The bounds on printing do not refuse real values: a 5 MB message through `string`,
/// `tojson` and `{{ messages }}`.
#[test]
fn large_real_values_still_print() {
    let content = "He said \"hi\" — 字\n".repeat(200_000);
    let messages = json!([{"role": "user", "content": content}]);
    let t = ChatTemplate::new(
        "{{ messages[0].content | string | length }}|{{ (messages[0].content | tojson) | length }}|{{ messages | string | length }}",
    )
    .unwrap();
    let out = t.render(&messages, &RenderOptions::default()).unwrap();
    let json_len = serde_json::to_string(&content).unwrap().chars().count();
    let parts: Vec<&str> = out.split('|').collect();
    assert_eq!(parts[0], content.chars().count().to_string());
    assert_eq!(parts[1], json_len.to_string());
    assert!(parts[2].parse::<usize>().unwrap() > content.chars().count());
}

// The limits are far above what a real prompt needs: a million-token context is about
// 4 MB of text.
const MAX_PROMPT: usize = 4 << 20;
const _: () = assert!(MAX_OUTPUT_BYTES >= 4 * MAX_PROMPT && MAX_STRING_BYTES >= MAX_PROMPT);

#[test]
fn the_fuel_grows_with_the_input() {
    assert_eq!(fuel_budget(0, 0), FUEL);
    assert!(fuel_budget(2000, MAX_OUTPUT_BYTES) >= FUEL + MAX_OUTPUT_BYTES as u64);
    // What a hostile template gets from a long conversation is what it takes to render.
    let t = ChatTemplate::new(
        "{% for m in messages %}{% for i in range(100000) %}{% endfor %}{% endfor %}",
    )
    .unwrap();
    let messages: Vec<Value> = (0..100)
        .map(|i| json!({"role": "user", "content": format!("{i}")}))
        .collect();
    match t.render(&Value::Array(messages), &RenderOptions::default()) {
        Err(ChatError::Limit(m)) => assert!(m.contains("FUEL_PER_MESSAGE"), "{m}"),
        other => panic!("expected ChatError::Limit, got {other:?}"),
    }
}

/// 2000 turns (about 1 MB) with every fixture template, and 20 000 with ChatML, whose
/// output is checked byte for byte.
#[test]
fn a_long_benign_conversation_renders() {
    let dir = fixture("chat");
    let mut messages = vec![json!({"role": "system", "content": "Be brief."})];
    for i in 0..2000 {
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        let content = format!("turn {i}: {}", "some text, é 字 ".repeat(30));
        messages.push(json!({"role": role, "content": content}));
    }
    let opts = RenderOptions {
        add_generation_prompt: true,
        ..RenderOptions::default()
    };
    for name in [
        "chatml.jinja",
        "smollm2.jinja",
        "qwen25.jinja",
        "qwen3.jinja",
    ] {
        let src = std::fs::read_to_string(dir.join(name)).unwrap();
        let t = ChatTemplate::new(&src).unwrap();
        let out = t
            .render(&Value::Array(messages.clone()), &opts)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(out.contains("turn 1999: "), "{name}");
        assert!(out.ends_with("<|im_start|>assistant\n"), "{name}");
    }

    let src = std::fs::read_to_string(dir.join("chatml.jinja")).unwrap();
    let t = ChatTemplate::new(&src).unwrap();
    let mut messages = Vec::new();
    let mut want = String::from("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n");
    for i in 0..20_000 {
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        let content = format!("turn {i}: {}", "word ".repeat(40));
        want.push_str(&format!("<|im_start|>{role}\n{content}<|im_end|>\n"));
        messages.push(json!({"role": role, "content": content}));
    }
    want.push_str("<|im_start|>assistant\n");
    let out = t.render(&Value::Array(messages), &opts).unwrap();
    assert!(out.len() > 4 << 20);
    assert!(out == want, "the 20 000-turn ChatML prompt differs");
}
