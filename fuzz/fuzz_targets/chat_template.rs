//! Any text as a chat template (it comes with the model file: hostile input): compiling and
//! rendering a small fixed conversation, with and without tools, either succeed or fail
//! with an error; never a panic, a hang or unbounded memory (the fuel and size limits of
//! `chat::template` bound them), and a prompt never exceeds `MAX_OUTPUT_BYTES`. Renders
//! run under a fuel cap of [`FUEL_CAP`] (a real template spends about 76 fuel per message
//! and 0.09 per byte of input, as measured for `FUEL`: under a thousand here), so that a
//! looping template costs milliseconds, not the production budget's hundreds; the same
//! limits and error paths are taken.
#![no_main]

use std::sync::OnceLock;

use cortiq_engine::chat::template::MAX_OUTPUT_BYTES;
use cortiq_engine::chat::{ChatTemplate, RenderOptions};
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};

/// Every message shape the fixtures' templates branch on: system, multi-turn, unicode,
/// an assistant tool call with its answer, reasoning content.
fn conversation() -> &'static (Value, Value) {
    static C: OnceLock<(Value, Value)> = OnceLock::new();
    C.get_or_init(|| {
        let messages = json!([
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Wie spät ist es? 🕰️ <|im_end|>"},
            {"role": "assistant", "content": "", "reasoning_content": "look it up",
             "tool_calls": [{"type": "function", "function":
                {"name": "now", "arguments": {"tz": "Europe/Berlin"}}}]},
            {"role": "tool", "content": "{\"time\": \"12:00\"}", "name": "now"},
            {"role": "assistant", "content": "<think>\nok\n</think>\n\nNoon."},
            {"role": "user", "content": [{"type": "text", "text": "thanks"}]}
        ]);
        let tools = json!([{"type": "function", "function": {
            "name": "now", "description": "The current time.",
            "parameters": {"type": "object", "properties": {"tz": {"type": "string"}},
                           "required": ["tz"]}}}]);
        (messages, tools)
    })
}

/// Far above what a real template spends on [`conversation`], far below `FUEL`.
const FUEL_CAP: u64 = 60_000;

fuzz_target!(|data: &[u8]| {
    let source = String::from_utf8_lossy(data);
    let Ok(t) = ChatTemplate::new(&source) else {
        return;
    };
    let (messages, tools) = conversation();
    let mut extra = serde_json::Map::new();
    extra.insert("enable_thinking".into(), Value::Bool(false));
    for opts in [
        RenderOptions {
            add_generation_prompt: true,
            bos_token: Some("<s>".into()),
            eos_token: Some("</s>".into()),
            fuel_cap: Some(FUEL_CAP),
            ..Default::default()
        },
        RenderOptions {
            tools: Some(tools.clone()),
            extra,
            fuel_cap: Some(FUEL_CAP),
            ..Default::default()
        },
    ] {
        if let Ok(text) = t.render(messages, &opts) {
            assert!(text.len() <= MAX_OUTPUT_BYTES);
        }
    }
});
