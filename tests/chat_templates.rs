//! Real models' chat templates (Qwen3, Qwen2.5, SmolLM3, Llama 3.2, Phi-3.5, Gemma) rendered
//! by smolchat exactly as transformers renders them: a system prompt, several turns, thinking
//! on and off, earlier turns' reasoning, and a final assistant message. The references come
//! from `tests/reference/templates_reference.py`.

use std::path::Path;

use smolchat::text::{ChatMessage, ChatTemplate, Role, TemplateVariables};

fn fixtures() -> &'static Path {
    Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/templates"
    ))
}

fn message(json: &serde_json::Value) -> ChatMessage {
    let role = match json["role"].as_str() {
        Some("system") => Role::System,
        Some("user") => Role::User,
        Some("assistant") => Role::Assistant,
        other => panic!("role {other:?}"),
    };
    let mut message = ChatMessage::new(role, json["content"].as_str().expect("content"));
    message.reasoning = json["reasoning_content"].as_str().map(str::to_owned);
    message
}

#[test]
fn real_templates_render_as_transformers_renders_them() {
    let text = std::fs::read_to_string(fixtures().join("expected.json")).expect("expected.json");
    let expected: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let cases = expected["cases"].as_array().expect("cases");
    let mut templates = std::collections::BTreeSet::new();
    for case in cases {
        let name = case["template"].as_str().expect("template");
        templates.insert(name);
        let source = std::fs::read_to_string(fixtures().join(format!("{name}.jinja")))
            .expect("template file");
        let mut variables: TemplateVariables =
            case["variables"].as_object().expect("variables").clone();
        let bos = variables.remove("bos_token");
        let eos = variables.remove("eos_token");
        let template = ChatTemplate::from_template_text(
            &source,
            bos.as_ref().and_then(|t| t.as_str()),
            eos.as_ref().and_then(|t| t.as_str()),
        )
        .unwrap_or_else(|err| panic!("{name}: {err}"));
        let messages: Vec<ChatMessage> = case["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .map(message)
            .collect();
        let add_generation_prompt = case["add_generation_prompt"].as_bool().expect("flag");
        let rendered = template
            .render_with(&messages, add_generation_prompt, &variables)
            .unwrap_or_else(|err| panic!("{name}, {}: {err}", case["case"]));
        assert_eq!(
            rendered,
            case["rendered"].as_str().expect("rendered"),
            "{name}, {}",
            case["case"]
        );
    }
    assert_eq!(templates.len(), 6, "{templates:?}");
}

/// Llama 3's template asks for today's date through `strftime_now`, as transformers gives it.
#[test]
fn llama3_writes_todays_date() {
    let source = std::fs::read_to_string(fixtures().join("meta-llama-Llama-3.2-3B-Instruct.jinja"))
        .expect("template");
    let template =
        ChatTemplate::from_template_text(&source, Some("<|begin_of_text|>"), None).expect("parses");
    let rendered = template
        .render(&[ChatMessage::user("Hi")], true)
        .expect("renders");
    let year = chrono::Local::now().format("%Y").to_string();
    assert!(
        rendered.contains("Today Date: ") && rendered.contains(&year),
        "{rendered}"
    );
    assert!(!rendered.contains("26 Jul 2024"), "{rendered}");
}

/// A template is code from whoever made the model: one that asks for exabytes, loops without
/// end, or writes without end fails with an error naming the template, and the app goes on.
#[test]
fn a_hostile_template_is_an_error_not_a_crash_or_a_hang() {
    let cases = [
        ("{{ 'a'|indent(2**62) }}", "indent width"),
        (
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
            "fuel",
        ),
        (
            "{% for i in range(100000) %}{{ 'a' * 1000 }}{% endfor %}",
            "longer than 16 MiB",
        ),
    ];
    for (source, expected) in cases {
        let started = std::time::Instant::now();
        let template = ChatTemplate::from_template_text(source, None, None).expect("parses");
        let err = template
            .render(&[ChatMessage::user("Hi")], true)
            .expect_err("refused");
        let message = format!("{err}: {:?}", std::error::Error::source(&err));
        assert!(message.contains("the custom template"), "{message}");
        assert!(message.contains(expected), "{source}: {message}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "{source}: {:?}",
            started.elapsed()
        );
    }
}
