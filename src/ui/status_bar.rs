//! One line at the bottom: model and backend, the charts, the live figures of the running (or
//! last) reply, and passing notices.

use egui::RichText;

use super::commands::Action;
use super::local_server::ServerStatus;
use super::state::{AppState, ModelStatus};
use super::stats_plot;
use crate::stats::memory;
use crate::store::MessageStats;

pub fn show(ui: &mut egui::Ui, state: &AppState, actions: &mut Vec<Action>) {
    ui.horizontal_wrapped(|ui| {
        match state.model() {
            ModelStatus::Ready(info) => {
                // The description already names the device (GPU adapter or CPU backend) and the
                // precision.
                ui.label(&info.description).on_hover_text(format!(
                    "{}\n{}",
                    info.dir.display(),
                    info.memory.describe()
                ));
            }
            ModelStatus::Loading {
                dir,
                memory,
                progress,
            } => {
                ui.spinner();
                ui.label(format!("Loading {}\u{2026}", dir.display()));
                if let Some(progress) = progress {
                    ui.add(
                        egui::ProgressBar::new(progress.fraction())
                            .desired_width(140.0)
                            .text(format!(
                                "layer {} of {}",
                                progress.layers_read, progress.layers
                            )),
                    );
                }
                if let Some(memory) = memory {
                    ui.label(RichText::new(memory.describe()).weak());
                }
            }
            ModelStatus::Downloading(_) => {
                ui.label("Downloading the model\u{2026}");
            }
            ModelStatus::NotConfigured | ModelStatus::Failed(_) => {
                ui.label("No model loaded");
            }
        }
        // The charts open over the chat, so they can be watched while a reply is written.
        ui.separator();
        ui.menu_button("Charts", |ui| {
            ui.set_min_width(320.0);
            stats_plot::show(ui, state);
        })
        .response
        .on_hover_text("Decode speed and memory over the last minute");
        if let Some(live) = state.live() {
            ui.separator();
            let stats = MessageStats::from_generation(&live.generation, live.resident_bytes);
            // A figure apiece, each kept on one line: as one label, a narrow window broke the
            // line inside a figure ("decode" at the end of a row, "1.2 tok/s" on the next).
            let mut figures = super::chat_view::stats_figures(&stats);
            if let Some(bytes) = live.resident_bytes {
                figures.push(format!("memory {:.0} MiB", memory::mib(bytes)));
            }
            if let Some(bytes) = live.device_bytes {
                figures.push(format!("GPU memory {:.0} MiB", memory::mib(bytes)));
            }
            for (index, figure) in figures.into_iter().enumerate() {
                let text = match index {
                    0 => figure,
                    _ => format!("\u{b7} {figure}"),
                };
                ui.add(egui::Label::new(text).extend());
            }
        }
        if let ServerStatus::Serving(address) = state.server() {
            ui.separator();
            // The port alone on loopback, kept whole: the full address broke across two rows
            // of a 1,000-point window beside a reply's figures. It is a click away.
            let url = format!("http://{address}/v1");
            let text = match address.ip().is_loopback() {
                true => format!("API :{}", address.port()),
                false => format!("API {address}"),
            };
            let label = ui
                .add(egui::Label::new(text).extend().sense(egui::Sense::click()))
                .on_hover_text(format!(
                    "Serve on localhost is on: other programs can use this model at {url}\n\
                     Click to copy the address"
                ));
            if label.clicked() {
                ui.ctx().copy_text(url);
            }
        }
        for (index, notice) in state.notices().into_iter().enumerate() {
            ui.separator();
            ui.label(RichText::new(notice).italics());
            if ui
                .small_button("OK")
                .on_hover_text("Dismiss this notice")
                .clicked()
            {
                actions.push(Action::DismissNotice(index));
            }
        }
    });
}
