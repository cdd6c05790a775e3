//! The conversation: messages as Markdown, the streaming reply growing at the bottom, and
//! per-message actions (copy, regenerate, edit and resend).

use egui::{RichText, ScrollArea};
use egui_commonmark::CommonMarkViewer;

use super::commands::{Action, UiCommand};
use super::state::{AppState, ModelStatus};
use super::theme;
use super::token_view;
use super::turn_heights::Shape;
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
    // Only the messages on screen are drawn; the others take the room they took when last
    // drawn (see `TurnHeights`), and are drawn once at least, when first shown.
    ScrollArea::vertical()
        .id_salt("chat")
        .stick_to_bottom(true)
        .auto_shrink([false, false])
        .show_viewport(ui, |ui, viewport| {
            let origin = ui.min_rect().top();
            centered_column(ui, |ui| {
                view.turn_heights.begin(
                    &conversation.id,
                    ui.available_width(),
                    show_tokens,
                    conversation.messages.len(),
                );
                let first_seen = first_seen(&conversation.messages);
                for (index, message) in conversation.messages.iter().enumerate() {
                    if first_seen == Some(index) {
                        // As many were left out as come before the first one seen.
                        left_out_marker(ui, index);
                    }
                    let turn = Turn {
                        index,
                        message,
                        last: index == last,
                        streaming: streaming == Some(index),
                        generating,
                    };
                    let shape = Shape {
                        text_len: message.content.len(),
                        variant: message.variant,
                        last: turn.last,
                        generating,
                    };
                    let editing = view
                        .editing
                        .as_ref()
                        .is_some_and(|(editing, _)| *editing == index);
                    let top = ui.cursor().top() - origin;
                    let known = view.turn_heights.get(index, shape);
                    if let Some(height) = known.filter(|_| !editing && !turn.streaming)
                        && (top + height < viewport.top() || top > viewport.bottom())
                    {
                        // The space after it is added as after the drawn message.
                        let spacing = ui.spacing().item_spacing.y;
                        ui.allocate_space(egui::vec2(
                            ui.available_width(),
                            (height - spacing).max(0.0),
                        ));
                    } else {
                        let before = ui.cursor().top();
                        if editing {
                            cancel_edit |= edit_box(ui, index, view, actions);
                        } else if message.role == Role::User {
                            user_turn(ui, &turn, view, actions);
                        } else {
                            reply_turn(ui, state, &turn, show_tokens, view, actions);
                        }
                        let height = ui.cursor().top() - before;
                        view.turn_heights.set(index, shape, height);
                    }
                    ui.add_space(14.0);
                }
            });
        });
    if cancel_edit {
        view.editing = None;
    }
}

/// One message of the conversation, as the functions that draw it need it.
struct Turn<'a> {
    index: usize,
    message: &'a StoredMessage,
    /// The conversation's last message.
    last: bool,
    /// The reply being written now.
    streaming: bool,
    /// Whether any reply is being written in this chat.
    generating: bool,
}

/// The box a user message is edited in; true when the edit was cancelled.
fn edit_box(
    ui: &mut egui::Ui,
    index: usize,
    view: &mut ViewState,
    actions: &mut Vec<Action>,
) -> bool {
    let Some((_, draft)) = &mut view.editing else {
        return false;
    };
    let label = ui.label("Edit message");
    let id = ui.make_persistent_id(("edit", index));
    // Taken before the box sees it, which would add a line.
    let resend_key = ui.memory(|memory| memory.has_focus(id))
        && ui.input_mut(|input| input.consume_key(egui::Modifiers::COMMAND, egui::Key::Enter));
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
    let mut cancelled = false;
    ui.horizontal(|ui| {
        let resend = ui
            .button("Resend")
            .on_hover_text("Send the edited message again (Ctrl+Enter); the message as it was stays as its earlier version");
        if resend.clicked() || resend_key {
            actions.push(Action::EditAndResend(index, draft.clone()));
        }
        cancelled = ui.button("Cancel").clicked();
    });
    cancelled
}

/// The user's turn: a bubble on the right, its actions under it.
fn user_turn(ui: &mut egui::Ui, turn: &Turn, view: &mut ViewState, actions: &mut Vec<Action>) {
    let message = turn.message;
    ui.with_layout(egui::Layout::top_down(egui::Align::Max), |ui| {
        let widest = ui.available_width() * 0.8;
        egui::Frame::new()
            .fill(theme::user_bubble(ui.visuals()))
            .corner_radius(theme::BUBBLE_RADIUS)
            .inner_margin(egui::Margin::symmetric(12, 8))
            .show(ui, |ui| {
                ui.set_max_width(widest);
                ui.add(egui::Label::new(&message.content).wrap());
            });
        if turn.generating {
            return;
        }
        let row = egui::vec2(ui.available_width(), ui.spacing().interact_size.y);
        ui.allocate_ui_with_layout(
            row,
            egui::Layout::right_to_left(egui::Align::Center),
            |ui| {
                // Right to left: the first added is the rightmost.
                if action_button(
                    ui,
                    "Fork",
                    "Start a new chat from the conversation up to here",
                ) {
                    actions.push(Action::Fork(turn.index));
                }
                if action_button(ui, "Edit", "Edit this message and send it again") {
                    view.start_editing(turn.index, &message.content);
                }
                if action_button(ui, "Copy", "Copy this message") {
                    ui.ctx().copy_text(message.content.clone());
                }
                variant_switcher(ui, turn, actions);
            },
        );
    });
}

/// A reply: no frame, the text the column's width, its actions and details under it.
fn reply_turn(
    ui: &mut egui::Ui,
    state: &AppState,
    turn: &Turn,
    show_tokens: bool,
    view: &mut ViewState,
    actions: &mut Vec<Action>,
) {
    let message = turn.message;
    match message.tokens() {
        tokens if show_tokens && !tokens.is_empty() => token_view::show(ui, tokens),
        _ => reply(ui, turn.index, message, turn.streaming, view),
    }
    if turn.streaming {
        // No spinner: it redraws the window every frame, and those frames took a core from
        // generation. Each new token redraws the text.
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
            "preparing the GPU: the first reply compiles its kernels\u{2026}".to_string()
        } else {
            "writing\u{2026}".to_string()
        };
        ui.label(RichText::new(doing).weak());
        return;
    }
    if turn.generating {
        return;
    }
    ui.horizontal_wrapped(|ui| {
        if action_button(ui, "Copy", "Copy this reply") {
            ui.ctx().copy_text(shown_text(message));
        }
        variant_switcher(ui, turn, actions);
        if turn.last {
            last_reply_actions(ui, message, actions);
        }
        if action_button(
            ui,
            "Fork",
            "Start a new chat from the conversation up to here",
        ) {
            actions.push(Action::Fork(turn.index));
        }
        if let Some(record) = &message.generation {
            generation_details(ui, record);
        }
    });
}

/// A small, quiet button under a message; whether it was clicked.
fn action_button(ui: &mut egui::Ui, label: &str, hint: &str) -> bool {
    ui.add(egui::Button::new(RichText::new(label).small()).frame(false))
        .on_hover_text(hint)
        .clicked()
}

/// What the Presets list shows while the chat's prompt is none of them.
const NO_PRESET: &str = "choose\u{2026}";

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
            ui.horizontal_wrapped(|ui| {
                let presets = &state.settings().prompt_presets;
                if !presets.is_empty() {
                    // The preset this chat's prompt is, by name, as a picker shows its choice.
                    let chosen = presets.iter().find(|preset| preset.text == current);
                    let label = ui.label("Preset");
                    egui::ComboBox::from_id_salt("presets")
                        .selected_text(chosen.map_or(NO_PRESET, |preset| preset.name.as_str()))
                        .show_ui(ui, |ui| {
                            for (index, preset) in presets.iter().enumerate() {
                                ui.horizontal(|ui| {
                                    let pick = ui
                                        .selectable_label(preset.text == current, &preset.name)
                                        .on_hover_text(&preset.text);
                                    if pick.clicked() {
                                        draft.clone_from(&preset.text);
                                        actions.push(Action::SetSystemPrompt(preset.text.clone()));
                                    }
                                    if ui
                                        .small_button("\u{2715}")
                                        .on_hover_text("Delete this preset")
                                        .clicked()
                                    {
                                        actions.push(Action::DeletePreset(index));
                                    }
                                });
                            }
                        })
                        .response
                        .labelled_by(label.id);
                }
                let name = ui.add(
                    egui::TextEdit::singleline(&mut view.preset_name)
                        .hint_text("preset name")
                        .desired_width(120.0),
                );
                let save = ui
                    .add_enabled(
                        !current.trim().is_empty(),
                        egui::Button::new("Save as preset"),
                    )
                    .on_hover_text("Keep this system prompt under a name, for any chat to pick");
                let entered = name.lost_focus() && ui.input(|i| i.key_pressed(egui::Key::Enter));
                if save.clicked() || (entered && !view.preset_name.trim().is_empty()) {
                    actions.push(Action::SavePreset(std::mem::take(&mut view.preset_name)));
                }
            });
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
        // Counted as the reply came; a chat saved before that was counted holds its tokens.
        let tokens = match message.generation.as_ref() {
            Some(record) if record.thinking_tokens > 0 => record.thinking_tokens,
            _ => thinking_tokens(message.tokens().iter().map(|token| token.text.as_str())),
        };
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
/// "‹ 2/3 ›" on a message with other versions (a reply regenerated, a message edited): each
/// shows that version with the conversation that followed it.
fn variant_switcher(ui: &mut egui::Ui, turn: &Turn, actions: &mut Vec<Action>) {
    let (index, message) = (turn.index, turn.message);
    let count = message.variant_count();
    if count < 2 {
        return;
    }
    let shown = message.variant;
    // The last reply's versions also answer to Alt+Left and Alt+Right.
    let ctx = ui.ctx().clone();
    let hint = |command: UiCommand, words: &str| {
        if turn.last && message.role == Role::Assistant {
            command.description(&ctx)
        } else {
            words.to_string()
        }
    };
    let previous = hint(UiCommand::PreviousReply, "Previous version");
    let next = hint(UiCommand::NextReply, "Next version");
    // Under a user's message the row is laid out right to left: added last first, the
    // switcher still reads "‹ 2/3 ›".
    let mut parts = [Part::Previous, Part::Count, Part::Next];
    if ui.layout().prefer_right_to_left() {
        parts.reverse();
    }
    for part in parts {
        match part {
            Part::Previous => {
                let button = egui::Button::new("\u{2039}").small();
                if ui
                    .add_enabled(shown > 0, button)
                    .on_hover_text(&previous)
                    .clicked()
                {
                    actions.push(Action::ShowVariant(index, shown - 1));
                }
            }
            Part::Count => {
                ui.label(format!("{}/{count}", shown + 1));
            }
            Part::Next => {
                let button = egui::Button::new("\u{203a}").small();
                if ui
                    .add_enabled(shown + 1 < count, button)
                    .on_hover_text(&next)
                    .clicked()
                {
                    actions.push(Action::ShowVariant(index, shown + 1));
                }
            }
        }
    }
}

/// The pieces of the variant switcher, in reading order.
enum Part {
    Previous,
    Count,
    Next,
}

fn last_reply_actions(ui: &mut egui::Ui, message: &StoredMessage, actions: &mut Vec<Action>) {
    let mut offer = |command: UiCommand, label: &str| {
        if action_button(ui, label, &command.description(ui.ctx())) {
            actions.push(command.into());
        }
    };
    offer(UiCommand::RegenerateLast, "Regenerate");
    if message.can_continue() {
        offer(UiCommand::ContinueLast, "Continue");
    }
}

/// Lays out `add` in a column of at most [`theme::MAX_CHAT_WIDTH`], in the middle of `ui`.
pub fn centered_column<R>(ui: &mut egui::Ui, add: impl FnOnce(&mut egui::Ui) -> R) -> R {
    let available = ui.available_width();
    let width = available.min(theme::MAX_CHAT_WIDTH);
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

/// The reply's own figures, kept after the status bar moves on, behind a small info mark: a
/// line of them under every reply was noise. Only an unfinished reply says why, in words.
fn generation_details(ui: &mut egui::Ui, record: &GenerationRecord) {
    let reason = match record.finish_reason {
        Some(FinishReason::StopToken) => None,
        Some(FinishReason::MaxTokens) => Some("max tokens reached"),
        Some(FinishReason::ContextFull) => Some("context full"),
        Some(FinishReason::Stopped) => Some("stopped"),
        None => Some("interrupted"),
    };
    if let Some(reason) = reason {
        ui.label(RichText::new(reason).small().weak());
    }
    let mut details = format!(
        "{}\n{} on {}\ntemperature {}, top-p {}, top-k {}, min-p {}, repetition penalty {}, seed {}",
        reason.unwrap_or("complete"),
        record.model,
        record.backend,
        record.sampling.temperature,
        record.sampling.top_p,
        record.sampling.top_k,
        record.sampling.min_p,
        record.sampling.repetition_penalty,
        record.sampling.seed,
    );
    if let Some(stats) = &record.stats {
        details.push('\n');
        details.push_str(&stats_line(stats));
    }
    let info = ui.add(egui::Button::new(RichText::new("\u{2139}").small().weak()).frame(false));
    info.widget_info(|| egui::WidgetInfo::labeled(egui::Role::Button, true, "Reply details"));
    info.on_hover_text(details);
}

pub fn stats_line(stats: &MessageStats) -> String {
    stats_figures(stats).join(" \u{b7} ")
}

/// The figures of [`stats_line`], apart: the status bar keeps each on one line.
pub fn stats_figures(stats: &MessageStats) -> Vec<String> {
    let rate = |value: Option<f64>| value.map_or("\u{2013}".to_string(), |v| format!("{v:.1}"));
    // With the conversation in the cache only the new turn is prefilled; one token is not a
    // prefill speed worth showing.
    let prefill = match (stats.prefill_tokens_per_second, stats.reused_tokens) {
        (None, reused) if reused > 0 => format!("{reused} prompt tokens cached"),
        (speed, 0) => format!("prefill {} tok/s", rate(speed)),
        (speed, reused) => format!("prefill {} tok/s ({reused} cached)", rate(speed)),
    };
    vec![
        format!("TTFT {:.0} ms", stats.time_to_first_token_ms),
        prefill,
        format!("decode {} tok/s", rate(stats.decode_tokens_per_second)),
        format!("{} tokens", stats.generated_tokens),
        format!("context {}/{}", stats.context_used, stats.context_limit),
    ]
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
            thinking_tokens: 0,
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
