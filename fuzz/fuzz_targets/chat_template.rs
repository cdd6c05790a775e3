//! libFuzzer entry point for chat templates, which come with downloaded models: any template
//! text, rendering any message text, must give a prompt or a named error, in bounded time
//! and memory (run with `-timeout` and `-rss_limit_mb`), never a panic.
//!
//! The input is the template, then a NUL, then the user's message.
#![no_main]

use smolchat::text::{ChatMessage, ChatTemplate, Role};
use smolchat_fuzz::fuzz_target;

fuzz_target!(|data| {
    let text = String::from_utf8_lossy(data);
    let (template, message) = text.split_once('\0').unwrap_or((&text, "Hello"));
    let Ok(template) = ChatTemplate::from_template_text(template, Some("<s>"), Some("</s>")) else {
        return;
    };
    let messages = [
        ChatMessage::new(Role::System, "You are helpful."),
        ChatMessage::new(Role::User, message),
        ChatMessage::new(Role::Assistant, "<think>\nhm\n</think>\n\nHi."),
        ChatMessage::new(Role::User, message),
    ];
    let _ = template.render(&messages, true);
    let _ = template.render_pieces(&messages, true, &Default::default());
});
