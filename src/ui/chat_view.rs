//! The conversation: messages as Markdown, the streaming reply growing at the bottom, and
//! per-message actions (copy, regenerate, edit and resend).

use egui::{Color32, RichText, ScrollArea};
use egui_commonmark::CommonMarkViewer;

use super::app::MAX_CHAT_WIDTH;
use super::commands::{Action, UiCommand};
use super::state::{AppState, ModelStatus};
use super::token_view;
use super::view_state::ViewState;
use crate::generation::{FinishReason, PromptProgress};
use crate::store::{GenerationRecord, MessageStats, StoredMessage};
use crate::text::Role;
use crate::text::reasoning::{THINK_CLOSE, split_reply, thinking_tokens};

pub fn show(ui: &mut egui::Ui, state: &AppState, view: &mut ViewState, actions: &mut Vec<Action>) {
    let streaming = state.streaming_message();
    let generating = state.is_generating();
    let show_tokens = state.settings().show_token_probabilities;
    let conversation = state.current();
    let last = conversation.messages.len().saturating_sub(1);
    let mut cancel_edit = false;
    centered_column(ui, |ui| {
        system_prompt(ui, state, view, actions);
        thinking_switch(ui, state, actions);
    });
    if conversation.messages.is_empty() {
        ui.centered_and_justified(|ui| {
            ui.label(RichText::new("Say hello to start the conversation.").weak());
        });
        return;
    }
    ScrollArea::vertical()
        .id_salt("chat")
        .stick_to_bottom(true)
        .auto_shrink([false, false])
        .show(ui, |ui| {
            centered_column(ui, |ui| {
                let first_seen = first_seen(&conversation.messages);
                for (index, message) in conversation.messages.iter().enumerate() {
                    if first_seen == Some(index) {
                        // As many were left out as come before the first one seen.
                        left_out_marker(ui, index);
                    }
                    let is_streaming = streaming == Some(index);
                    message_frame(ui, message.role).show(ui, |ui| {
                        ui.set_width(ui.available_width());
                        ui.label(RichText::new(role_name(message.role)).strong());
                        if let Some((editing, draft)) = &mut view.editing
                            && *editing == index
                        {
                            let label = ui.label("Edit message");
                            let id = ui.make_persistent_id(("edit", index));
                            // Taken before the box sees it, which would add a line.
                            let resend_key = ui.memory(|memory| memory.has_focus(id))
                                && ui.input_mut(|input| {
                                    input.consume_key(egui::Modifiers::COMMAND, egui::Key::Enter)
                                });
                            let field = ui
                                .add(
                                    egui::TextEdit::multiline(draft)
                                        .id(id)
                                        .desired_width(f32::INFINITY),
                                )
                                .labelled_by(label.id);
                            if std::mem::take(&mut view.focus_edit) {
                                field.request_focus();
                            }
                            ui.horizontal(|ui| {
                                let resend = ui
                                    .button("Resend")
                                    .on_hover_text("Send the edited message again (Ctrl+Enter)");
                                if resend.clicked() || resend_key {
                                    actions.push(Action::EditAndResend(index, draft.clone()));
                                }
                                cancel_edit |= ui.button("Cancel").clicked();
                            });
                            return;
                        }
                        match message.tokens() {
                            tokens if show_tokens && !tokens.is_empty() => {
                                token_view::show(ui, tokens)
                            }
                            _ if message.role == Role::Assistant => {
                                reply(ui, index, message, is_streaming, view);
                            }
                            _ => {
                                ui.label(&message.content);
                            }
                        }
                        if is_streaming {
                            // No spinner: it redraws the window every frame, and those frames
                            // took a core from generation. Each new token redraws the text.
                            let doing = if state.stopping() {
                                "stopping once the step under way ends\u{2026}".to_string()
                            } else if let Some(ahead) = state.waiting_behind() {
                                match ahead {
                                    1 => "waiting: 1 request ahead\u{2026}".to_string(),
                                    n => format!("waiting: {n} requests ahead\u{2026}"),
                                }
                            } else if let Some(reading) = state.reading_prompt() {
                                reading_label(ui, reading)
                            } else if state.preparing_gpu() {
                                "preparing the GPU: the first reply compiles its kernels\u{2026}"
                                    .to_string()
                            } else {
                                "writing\u{2026}".to_string()
                            };
                            ui.label(RichText::new(doing).weak());
                            return;
                        }
                        ui.horizontal_wrapped(|ui| {
                            if ui
                                .small_button("Copy")
                                .on_hover_text("Copy this message")
                                .clicked()
                            {
                                ui.ctx().copy_text(shown_text(message));
                            }
                            if message.role == Role::User
                                && !generating
                                && ui
                                    .small_button("Edit")
                                    .on_hover_text("Edit this message and send it again")
                                    .clicked()
                            {
                                view.editing = Some((index, message.content.clone()));
                                view.focus_edit = true;
                            }
                            if message.role == Role::Assistant && index == last && !generating {
                                last_reply_actions(ui, message, actions);
                            }
                            if let Some(record) = &message.generation {
                                generation_summary(ui, record);
                            }
                        });
                    });
                    ui.add_space(8.0);
                }
            });
        });
    if cancel_edit {
        view.editing = None;
    }
}

/// The chat's system prompt, folded to one line at the top; edits apply from the next reply.
fn system_prompt(
    ui: &mut egui::Ui,
    state: &AppState,
    view: &mut ViewState,
    actions: &mut Vec<Action>,
) {
    let id = &state.current().id;
    let current = state.system_prompt();
    let draft = match &mut view.system_prompt {
        Some((owner, draft)) if owner == id => draft,
        other => &mut other.insert((id.clone(), current.to_string())).1,
    };
    let first_line = current.lines().next().unwrap_or_default();
    let title = if first_line.is_empty() {
        "System prompt: none".to_string()
    } else {
        format!("System prompt: {first_line}")
    };
    egui::CollapsingHeader::new(RichText::new(title).weak())
        .id_salt("system prompt")
        .show(ui, |ui| {
            let label =
                ui.label("This chat's system prompt (the settings hold the default for new chats)");
            let response = ui
                .add(
                    egui::TextEdit::multiline(draft)
                        .hint_text("e.g. You are a concise assistant.")
                        .desired_rows(2)
                        .desired_width(f32::INFINITY),
                )
                .labelled_by(label.id);
            if response.lost_focus() && draft.as_str() != current {
                actions.push(Action::SetSystemPrompt(draft.clone()));
            }
        });
}

/// A reasoning model's reply: its thinking folded above the answer (open while the model is
/// still thinking), then the answer as Markdown.
fn reply(
    ui: &mut egui::Ui,
    index: usize,
    message: &StoredMessage,
    streaming: bool,
    view: &mut ViewState,
) {
    let (thinking, answer) = split_reply(&message.content);
    if let Some(thinking) = thinking {
        let still_thinking = streaming && !message.content.contains(THINK_CLOSE);
        let tokens = thinking_tokens(message.tokens().iter().map(|token| token.text.as_str()));
        let title = if still_thinking {
            format!("Thinking\u{2026} {tokens} tokens")
        } else {
            let seconds = message
                .generation
                .as_ref()
                .and_then(|record| record.stats.as_ref()?.decode_tokens_per_second)
                .filter(|rate| *rate > 0.0)
                .map(|rate| format!(" \u{b7} {:.1} s", tokens as f64 / rate))
                .unwrap_or_default();
            format!("Thought for {tokens} tokens{seconds}")
        };
        // The streaming header is another widget than the finished one, so that a reply
        // shows its thinking while it comes and is folded once the answer begins.
        egui::CollapsingHeader::new(RichText::new(title).weak())
            .id_salt(("thinking", index, still_thinking))
            .default_open(still_thinking)
            .show(ui, |ui| {
                ui.label(RichText::new(thinking).weak());
            });
        ui.add_space(4.0);
    }
    CommonMarkViewer::new().show(ui, &mut view.markdown, &answer);
}

/// A bar for a long prompt being read, and what to say under it: "reading the conversation:
/// 2,304 / 8,112 tokens". Reading a long chat takes a while on a CPU, and without it the
/// reply card said only "writing" for a minute.
fn reading_label(ui: &mut egui::Ui, reading: PromptProgress) -> String {
    let fraction = reading.done as f32 / reading.total.max(1) as f32;
    ui.add(egui::ProgressBar::new(fraction).desired_height(6.0));
    format!(
        "reading the conversation: {} / {} tokens\u{2026}",
        grouped(reading.done),
        grouped(reading.total)
    )
}

/// `n` with a comma between thousands.
pub fn grouped(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// What Copy takes: a reply's answer without its thinking.
fn shown_text(message: &StoredMessage) -> String {
    match message.role {
        Role::Assistant => split_reply(&message.content).1,
        _ => message.content.clone(),
    }
}

/// "Think before answering" for a model whose template can turn thinking off.
fn thinking_switch(ui: &mut egui::Ui, state: &AppState, actions: &mut Vec<Action>) {
    let ModelStatus::Ready(info) = state.model() else {
        return;
    };
    if !info.thinking_switch {
        return;
    }
    let mut thinking = state.current().thinking.unwrap_or(true);
    if ui
        .checkbox(&mut thinking, "Think before answering")
        .on_hover_text("Off: the model answers at once, without a Thinking section (this chat)")
        .changed()
    {
        actions.push(Action::SetThinking(thinking));
    }
}

/// Regenerate, Continue and "‹ 2/3 ›" between the replies to the last turn.
fn last_reply_actions(ui: &mut egui::Ui, message: &StoredMessage, actions: &mut Vec<Action>) {
    let count = message.variant_count();
    if count > 1 {
        let shown = message.variant;
        if ui
            .add_enabled(shown > 0, egui::Button::new("\u{2039}").small())
            .on_hover_text(UiCommand::PreviousReply.description(ui.ctx()))
            .clicked()
        {
            actions.push(UiCommand::PreviousReply.into());
        }
        ui.label(format!("{}/{count}", shown + 1));
        if ui
            .add_enabled(shown + 1 < count, egui::Button::new("\u{203a}").small())
            .on_hover_text(UiCommand::NextReply.description(ui.ctx()))
            .clicked()
        {
            actions.push(UiCommand::NextReply.into());
        }
    }
    let mut offer = |command: UiCommand, label: &str| {
        if ui
            .small_button(label)
            .on_hover_text(command.description(ui.ctx()))
            .clicked()
        {
            actions.push(command.into());
        }
    };
    offer(UiCommand::RegenerateLast, "Regenerate");
    if message.can_continue() {
        offer(UiCommand::ContinueLast, "Continue");
    }
}

/// Lays out `add` in a column of at most [`MAX_CHAT_WIDTH`], in the middle of `ui`.
pub fn centered_column<R>(ui: &mut egui::Ui, add: impl FnOnce(&mut egui::Ui) -> R) -> R {
    let available = ui.available_width();
    let width = available.min(MAX_CHAT_WIDTH);
    ui.horizontal(|ui| {
        ui.add_space(((available - width) / 2.0).max(0.0));
        ui.vertical(|ui| {
            ui.set_width(width);
            add(ui)
        })
        .inner
    })
    .inner
}

/// One item of a list of things (a model, a download, a deleted chat): a rounded frame the
/// column's width, around `add`.
pub fn card<R>(ui: &mut egui::Ui, add: impl FnOnce(&mut egui::Ui) -> R) -> R {
    egui::Frame::group(ui.style())
        .corner_radius(6.0)
        .show(ui, |ui| {
            ui.set_width(ui.available_width());
            add(ui)
        })
        .inner
}

fn message_frame(ui: &egui::Ui, role: Role) -> egui::Frame {
    let visuals = ui.visuals();
    let fill = match role {
        Role::User => visuals.faint_bg_color,
        _ => Color32::TRANSPARENT,
    };
    egui::Frame::group(ui.style()).fill(fill).corner_radius(6.0)
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::System => "System",
        Role::User => "You",
        Role::Assistant => "Assistant",
    }
}

/// The first message the model saw when it wrote the latest reply, when that reply's prompt
/// left older ones out to fit the context.
fn first_seen(messages: &[StoredMessage]) -> Option<usize> {
    messages
        .iter()
        .rev()
        .find_map(|message| message.generation.as_ref())
        .map(|record| record.left_out)
        .filter(|&left_out| left_out > 0 && left_out < messages.len())
}

/// A line across the conversation where the model's view of it begins.
fn left_out_marker(ui: &mut egui::Ui, left_out: usize) {
    ui.separator();
    ui.label(
        RichText::new(format!(
            "\u{2191} {left_out} earlier messages were left out of the context of the last reply: the model no longer sees them."
        ))
        .small()
        .weak(),
    );
    ui.add_space(8.0);
}

/// The reply's own figures, kept after the status bar moves on.
fn generation_summary(ui: &mut egui::Ui, record: &GenerationRecord) {
    let reason = match record.finish_reason {
        Some(FinishReason::StopToken) => "complete",
        Some(FinishReason::MaxTokens) => "max tokens reached",
        Some(FinishReason::ContextFull) => "context full",
        Some(FinishReason::Stopped) => "stopped",
        None => "interrupted",
    };
    let mut text = format!("{reason} \u{b7} seed {}", record.sampling.seed);
    if let Some(stats) = &record.stats {
        text.push_str(" \u{b7} ");
        text.push_str(&stats_line(stats));
    }
    ui.label(RichText::new(text).small().weak())
        .on_hover_text(format!(
            "{} on {}; temperature {}, top-p {}, top-k {}, min-p {}, repetition penalty {}",
            record.model,
            record.backend,
            record.sampling.temperature,
            record.sampling.top_p,
            record.sampling.top_k,
            record.sampling.min_p,
            record.sampling.repetition_penalty
        ));
}

pub fn stats_line(stats: &MessageStats) -> String {
    let rate = |value: Option<f64>| value.map_or("\u{2013}".to_string(), |v| format!("{v:.1}"));
    // With the conversation in the cache only the new turn is prefilled; one token is not a
    // prefill speed worth showing.
    let prefill = match (stats.prefill_tokens_per_second, stats.reused_tokens) {
        (None, reused) if reused > 0 => format!("{reused} prompt tokens cached"),
        (speed, 0) => format!("prefill {} tok/s", rate(speed)),
        (speed, reused) => format!("prefill {} tok/s ({reused} cached)", rate(speed)),
    };
    format!(
        "TTFT {:.0} ms \u{b7} {prefill} \u{b7} decode {} tok/s \u{b7} {} tokens \u{b7} context {}/{}",
        stats.time_to_first_token_ms,
        rate(stats.decode_tokens_per_second),
        stats.generated_tokens,
        stats.context_used,
        stats.context_limit
    )
}

#[cfg(test)]
mod tests {
    use super::first_seen;
    use crate::store::{GenerationRecord, StoredMessage};
    use crate::text::Role;

    fn reply(left_out: usize) -> StoredMessage {
        let mut message = StoredMessage::new(Role::Assistant, "a reply");
        message.generation = Some(GenerationRecord {
            model: "m".into(),
            model_dir: "/m".into(),
            backend: crate::backend::BackendKind::default(),
            sampling: crate::text::SamplingParams::default(),
            max_new_tokens: 8,
            overflow: crate::text::OverflowPolicy::default(),
            finish_reason: None,
            stats: None,
            tokens: Vec::new(),
            left_out,
        });
        message
    }

    /// The marker goes where the latest reply's view began, and nowhere when it saw it all.
    #[test]
    fn the_marker_goes_before_the_first_message_the_latest_reply_saw() {
        let user = || StoredMessage::new(Role::User, "a question");
        let messages = [user(), reply(0), user(), reply(2), user(), reply(2)];
        assert_eq!(first_seen(&messages), Some(2));
        let messages = [user(), reply(0), user(), reply(2), user(), reply(0)];
        assert_eq!(first_seen(&messages), None);
        assert_eq!(first_seen(&[user()]), None);
    }
}
