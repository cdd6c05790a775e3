//! Sampling, context and model choices. The widgets edit a copy of the settings, which goes
//! back as one [`Action::UpdateSettings`]: every change is saved at once and used by the next
//! reply; changing the backend, the precision or the model folder reloads the model.

use super::commands::Action;
use super::first_run::model_path_field;
use super::labels;
use super::local_server::ServerStatus;
use super::state::{AppState, ModelStatus};
use super::view_state::ViewState;
use crate::backend::BackendKind;
use crate::engine::DEFAULT_PARALLEL;
use crate::generation::MemoryPlan;
use crate::model::Precision;
use crate::stats::memory;
use crate::store::{SeedMode, Settings};
use crate::text::OverflowPolicy;

/// The backends offered, with what a user needs to know to choose; a new backend is one
/// more line here.
const BACKENDS: [(BackendKind, &str); 3] = [
    (BackendKind::Flex, "CPU (flex, fastest)"),
    (BackendKind::Ndarray, "CPU (ndarray)"),
    (BackendKind::Gpu, "GPU (wgpu)"),
];

const PRECISIONS: [(Precision, &str); 4] = [
    (Precision::F32, "f32 (exact, recommended)"),
    (Precision::Bf16, "bf16 (half the memory of f32 weights)"),
    (Precision::F16, "f16 (as bf16, closer to f32)"),
    (Precision::Q8, "8-bit weights (least memory)"),
];

/// The same for a GGUF file's integer weights, which stay as stored on the CPU (the status
/// bar says which): the choice changes only activations and the cache, so "exact" and
/// "least memory" would promise what such a file cannot give. Short, as a long name squeezes
/// the combo's label.
const PRECISIONS_FOR_INTEGERS: [(Precision, &str); 4] = [
    (Precision::F32, "f32 (recommended)"),
    (Precision::Bf16, "bf16 (16-bit activations)"),
    (Precision::F16, "f16 (16-bit activations)"),
    (Precision::Q8, "8-bit (no change here)"),
];

/// The precisions as the model in use takes them (the GPU dequantizes integer weights to
/// the precision chosen).
fn precisions(
    integer_weights: Option<&str>,
    backend: BackendKind,
) -> &'static [(Precision, &'static str); 4] {
    if integer_weights.is_some() && backend != BackendKind::Gpu {
        &PRECISIONS_FOR_INTEGERS
    } else {
        &PRECISIONS
    }
}

pub fn show(ui: &mut egui::Ui, state: &AppState, view: &mut ViewState, actions: &mut Vec<Action>) {
    egui::ScrollArea::vertical()
        .id_salt("settings")
        .show(ui, |ui| {
            ui.heading("Settings");
            let mut settings = state.settings().clone();
            let mut changed = false;
            section(ui, "Sampling", |ui| {
                changed |= sampling(ui, state, &mut settings, actions)
            });
            section(ui, "Reply and context", |ui| {
                changed |= context_and_prompt(ui, &mut settings);
                let plan = match state.model() {
                    ModelStatus::Ready(info) => Some(&info.memory),
                    _ => None,
                };
                changed |= conversation_memory(ui, &mut settings, plan);
            });
            section(ui, "Model", |ui| {
                changed |= model(ui, state, &mut settings, view, actions)
            });
            section(ui, "Local API server", |ui| {
                changed |= local_server(ui, &mut settings, state.server())
            });
            if changed {
                actions.push(Action::UpdateSettings(settings));
            }
        });
}

/// A part of the panel that folds away; egui remembers which are folded.
fn section(ui: &mut egui::Ui, title: &str, add: impl FnOnce(&mut egui::Ui)) {
    egui::CollapsingHeader::new(egui::RichText::new(title).strong())
        .default_open(true)
        .show(ui, add);
}

/// The sliders edit the defaults, or the current chat's own sampling once it has one.
fn sampling(
    ui: &mut egui::Ui,
    state: &AppState,
    s: &mut Settings,
    actions: &mut Vec<Action>,
) -> bool {
    let chat = state.current().sampling.as_ref();
    let mut own = chat.is_some();
    if ui
        .checkbox(&mut own, "This chat's own")
        .on_hover_text("Sampling for this chat only; off, it follows the defaults")
        .changed()
    {
        actions.push(Action::SetChatSampling(own.then(|| s.sampling.clone())));
    }
    let before = chat.unwrap_or(&s.sampling).clone();
    let mut p = before.clone();
    ui.add(egui::Slider::new(&mut p.temperature, 0.0..=2.0).text(labels::TEMPERATURE))
        .on_hover_text("0 always picks the likeliest token; higher is more varied");
    ui.add(egui::Slider::new(&mut p.top_p, 0.01..=1.0).text(labels::TOP_P))
        .on_hover_text("Keep the likeliest tokens holding this much probability; 1 = off");
    ui.add(egui::Slider::new(&mut p.top_k, 0..=200).text("Top-k"))
        .on_hover_text("Keep only this many likeliest tokens; 0 = off");
    ui.add(egui::Slider::new(&mut p.min_p, 0.0..=0.5).text("Min-p"))
        .on_hover_text("Drop tokens less likely than this times the likeliest; 0 = off");
    ui.add(egui::Slider::new(&mut p.repetition_penalty, 0.5..=2.0).text("Repetition penalty"))
        .on_hover_text("Discourage repeating tokens; 1 = off");
    let mut changed = false;
    ui.horizontal(|ui| {
        changed |= ui
            .radio_value(&mut s.seed_mode, SeedMode::Random, "Random seed")
            .changed();
        changed |= ui
            .radio_value(&mut s.seed_mode, SeedMode::Fixed, "Fixed seed")
            .changed();
    });
    if s.seed_mode == SeedMode::Fixed {
        ui.horizontal(|ui| {
            let label = ui.label("Seed");
            ui.add(egui::DragValue::new(&mut p.seed))
                .labelled_by(label.id);
        });
    }
    if p != before {
        if chat.is_some() {
            actions.push(Action::SetChatSampling(Some(p)));
        } else {
            s.sampling = p;
            changed = true;
        }
    }
    changed
}

fn context_and_prompt(ui: &mut egui::Ui, s: &mut Settings) -> bool {
    let mut changed = false;
    changed |= ui
        .add(
            egui::Slider::new(&mut s.max_new_tokens, 1..=2048)
                .logarithmic(true)
                .text(labels::MAX_NEW_TOKENS),
        )
        .changed();
    egui::ComboBox::from_label("When the context is full")
        .selected_text(overflow_name(s.overflow))
        .show_ui(ui, |ui| {
            for policy in [OverflowPolicy::DropOldestTurns, OverflowPolicy::Stop] {
                changed |= ui
                    .selectable_value(&mut s.overflow, policy, overflow_name(policy))
                    .changed();
            }
        });
    let label = ui.label("Default system prompt");
    changed |= ui
        .add(
            egui::TextEdit::multiline(&mut s.system_prompt)
                .hint_text("e.g. You are a concise assistant.")
                .desired_rows(3),
        )
        .labelled_by(label.id)
        .changed();
    changed
}

/// How many tokens the conversations' caches may hold together, and what that takes.
fn conversation_memory(ui: &mut egui::Ui, s: &mut Settings, plan: Option<&MemoryPlan>) -> bool {
    // Before a model is ready there is no context to measure by; a common one stands in.
    let context = plan.map_or(8192, |plan| plan.context);
    let mut changed = false;
    let label = ui.label(labels::CONVERSATION_MEMORY);
    let mut whole_context = s.kv_budget.is_none();
    if ui
        .checkbox(&mut whole_context, "One full context")
        .on_hover_text(
            "The window's chat and the local API's requests share the conversations' memory. \
             When it is full, a new request waits for a running one to end, and the \
             conversations unused longest are forgotten first (they are read again when \
             continued).",
        )
        .changed()
    {
        s.kv_budget = (!whole_context).then_some(context);
        changed = true;
    }
    if let Some(budget) = &mut s.kv_budget {
        // Four slots of one context each hold at most four contexts.
        let most = (DEFAULT_PARALLEL * context).max(*budget);
        changed |= ui
            .add(
                egui::Slider::new(budget, MIN_CONVERSATION_MEMORY..=most)
                    .logarithmic(true)
                    .suffix(" tokens"),
            )
            .labelled_by(label.id)
            .changed();
    }
    if let Some(plan) = plan {
        let tokens = s.kv_budget.unwrap_or(context) as u64;
        let bytes = tokens * plan.kv_bytes_per_token;
        ui.label(egui::RichText::new(format!("up to {:.0} MiB", memory::mib(bytes))).weak());
    }
    changed
}

/// The least memory the slider offers: a short chat's worth.
const MIN_CONVERSATION_MEMORY: usize = 512;

fn overflow_name(policy: OverflowPolicy) -> &'static str {
    match policy {
        OverflowPolicy::DropOldestTurns => "Leave out the oldest turns",
        OverflowPolicy::Stop => "Stop and say so",
    }
}

/// A combo box over `options`; true when the user picked another one.
fn choice<T: Copy + PartialEq>(
    ui: &mut egui::Ui,
    label: &str,
    value: &mut T,
    options: &[(T, &str)],
) -> bool {
    let before = *value;
    let selected = options
        .iter()
        .find(|(option, _)| *option == before)
        .map_or("?", |(_, name)| *name);
    egui::ComboBox::from_label(label)
        .selected_text(selected)
        .show_ui(ui, |ui| {
            for &(option, name) in options {
                ui.selectable_value(value, option, name);
            }
        });
    *value != before
}

/// True when the backend or the precision changed (which reloads the model).
fn model(
    ui: &mut egui::Ui,
    state: &AppState,
    s: &mut Settings,
    view: &mut ViewState,
    actions: &mut Vec<Action>,
) -> bool {
    let integer_weights = match state.model() {
        ModelStatus::Ready(info) => info.integer_weights.as_deref(),
        _ => None,
    };
    let precisions = precisions(integer_weights, s.backend);
    let changed = choice(ui, "Backend", &mut s.backend, &BACKENDS)
        | choice(ui, "Precision", &mut s.precision, precisions);
    let label = ui.label(labels::CURRENT_MODEL);
    model_path_field(ui, label.id, "Load", view, actions, f32::INFINITY);
    changed
}

/// The "Serve on localhost" switch. Address, port and key are edited while it is off, so the
/// server never restarts on a half-typed value.
fn local_server(ui: &mut egui::Ui, s: &mut Settings, status: &ServerStatus) -> bool {
    let mut changed = ui
        .checkbox(&mut s.server.enabled, labels::SERVE_ON_LOCALHOST)
        .on_hover_text("Other programs use the loaded model through OpenAI's API")
        .changed();
    ui.add_enabled_ui(!s.server.enabled, |ui| {
        egui::Grid::new("server address")
            .num_columns(2)
            .show(ui, |ui| {
                let label = ui.label("Address");
                changed |= ui
                    .add(egui::TextEdit::singleline(&mut s.server.host).desired_width(120.0))
                    .labelled_by(label.id)
                    .on_hover_text("127.0.0.1: this machine only; any other address needs a key")
                    .changed();
                ui.end_row();
                let label = ui.label("Port");
                changed |= ui
                    .add(egui::DragValue::new(&mut s.server.port))
                    .labelled_by(label.id)
                    .changed();
                ui.end_row();
                let label = ui.label("API key");
                changed |= ui
                    .add(
                        egui::TextEdit::singleline(&mut s.server.api_key)
                            .password(true)
                            .hint_text("none")
                            .desired_width(120.0),
                    )
                    .labelled_by(label.id)
                    .on_hover_text("Clients send it as Authorization: Bearer KEY")
                    .changed();
                ui.end_row();
            });
    });
    let line = status.describe();
    match status {
        ServerStatus::Failed(_) => ui.colored_label(ui.visuals().error_fg_color, line),
        _ => ui.add(egui::Label::new(line).selectable(true)),
    };
    changed
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Q4_1 file was offered "f32 (exact, recommended)" and "8-bit weights (least
    /// memory)": neither holds for weights that stay 4-bit integers on the CPU.
    #[test]
    fn a_quantized_file_is_not_promised_exactness_or_less_memory() {
        let names = |integers, backend| -> Vec<&str> {
            precisions(integers, backend)
                .iter()
                .map(|(_, name)| *name)
                .collect()
        };
        let quantized = names(Some("Q8_0+Q4_1"), BackendKind::Flex);
        assert!(
            !quantized
                .iter()
                .any(|name| name.contains("exact") || name.contains("least"))
        );
        assert_eq!(quantized[0], "f32 (recommended)");
        assert!(quantized[3].contains("no change"), "{}", quantized[3]);
        assert!(names(None, BackendKind::Flex)[0].contains("exact"));
        // The GPU dequantizes them to the precision chosen: the plain names hold.
        assert_eq!(
            names(Some("Q4_1"), BackendKind::Gpu),
            names(None, BackendKind::Gpu)
        );
    }
}
