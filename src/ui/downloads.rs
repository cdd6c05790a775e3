//! The library's downloads: each with its progress, speed and time left, and Pause, Resume,
//! Cancel or Open; and the one line of progress the first-run screen shares with them.

use std::time::Duration;

use egui::RichText;

use super::chat_view::card;
use super::commands::Action;
use super::state::AppState;
use crate::downloads::{Download, DownloadState};
use crate::hub::DownloadProgress;
use crate::model_library::size_text;

/// The downloads section, when there are any.
pub fn show(ui: &mut egui::Ui, state: &AppState, actions: &mut Vec<Action>) {
    let list = state.downloads().list();
    if list.is_empty() {
        return;
    }
    ui.label(RichText::new("Downloads").strong());
    for download in list {
        card(ui, |ui| row(ui, download, actions));
        ui.add_space(4.0);
    }
}

fn row(ui: &mut egui::Ui, download: &Download, actions: &mut Vec<Action>) {
    ui.horizontal(|ui| {
        ui.label(RichText::new(&download.spec).strong());
        ui.with_layout(egui::Layout::right_to_left(egui::Align::Center), |ui| {
            buttons(ui, download, actions)
        });
    });
    match &download.state {
        DownloadState::Queued => {
            ui.label(RichText::new("Waiting for the download before it").weak());
        }
        DownloadState::Running(None) => {
            ui.label(RichText::new("Asking the hub\u{2026}").weak());
        }
        DownloadState::Running(Some(progress)) => {
            ui.add(
                egui::ProgressBar::new(progress.fraction().unwrap_or(0.0) as f32)
                    .desired_height(6.0),
            );
            ui.label(progress_text(progress));
            if let Some(retry) = &progress.reconnecting {
                ui.colored_label(
                    ui.visuals().warn_fg_color,
                    format!(
                        "Connection lost ({}). Reconnecting in {:.0} s, attempt {} of {}; the \
                         bytes already here are kept.",
                        retry.reason,
                        retry.after.as_secs_f64().ceil(),
                        retry.attempt,
                        retry.attempts
                    ),
                );
            }
        }
        DownloadState::Paused(progress) => {
            let done = progress
                .as_ref()
                .map(|progress| format!(" at {}", amount_text(progress)))
                .unwrap_or_default();
            ui.label(format!("Paused{done}; what came is kept."));
        }
        DownloadState::Failed(reason) => {
            ui.colored_label(ui.visuals().error_fg_color, reason);
        }
        DownloadState::Done(path) => {
            ui.label(RichText::new(format!("Downloaded to {}", path.display())).weak());
        }
    }
}

fn buttons(ui: &mut egui::Ui, download: &Download, actions: &mut Vec<Action>) {
    let id = download.id;
    let cancel = match download.state {
        DownloadState::Done(_) => "Remove from the list",
        _ => "Cancel",
    };
    if ui
        .small_button(cancel)
        .on_hover_text(match download.state {
            DownloadState::Done(_) => "The model stays on this computer",
            _ => "Stops it and deletes what came",
        })
        .clicked()
    {
        actions.push(Action::CancelDownload(id));
    }
    match &download.state {
        DownloadState::Queued | DownloadState::Running(_) => {
            if ui.small_button("Pause").clicked() {
                actions.push(Action::PauseDownload(id));
            }
        }
        DownloadState::Paused(_) | DownloadState::Failed(_) => {
            let label = match download.state {
                DownloadState::Failed(_) => "Try again",
                _ => "Resume",
            };
            if ui.small_button(label).clicked() {
                actions.push(Action::ResumeDownload(id));
            }
        }
        DownloadState::Done(path) => {
            if ui.small_button("Open").clicked() {
                actions.push(Action::UseModelFolder(path.clone()));
            }
        }
    }
}

/// "model.safetensors (2 of 3) · 120 MB of 270 MB · 12 MB/s · 13 s left".
pub fn progress_text(progress: &DownloadProgress) -> String {
    let mut parts = vec![match progress.file_count {
        0 | 1 => progress.file.clone(),
        count => format!("{} ({} of {count})", progress.file, progress.file_index),
    }];
    parts.push(amount_text(progress));
    if progress.bytes_per_sec > 0.0 {
        parts.push(format!("{}/s", size_text(progress.bytes_per_sec as u64)));
    }
    parts.extend(progress.eta.map(time_left));
    parts.join("  \u{b7}  ")
}

/// "120 MB of 270 MB", or "120 MB" when the size is not known.
fn amount_text(progress: &DownloadProgress) -> String {
    match progress.bytes_total {
        Some(total) => format!("{} of {}", size_text(progress.bytes_done), size_text(total)),
        None => size_text(progress.bytes_done),
    }
}

/// "13 s left", "4 min left", "1 h 5 min left".
fn time_left(eta: Duration) -> String {
    let seconds = eta.as_secs();
    match seconds {
        0..60 => format!("{seconds} s left"),
        60..3600 => format!("{} min left", seconds.div_ceil(60)),
        _ => format!("{} h {} min left", seconds / 3600, seconds % 3600 / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_reads_as_a_person_would_say_it() {
        let progress = DownloadProgress {
            file: "model.safetensors".into(),
            file_index: 2,
            file_count: 3,
            bytes_done: 120_000_000,
            bytes_total: Some(270_000_000),
            bytes_per_sec: 12_000_000.0,
            eta: Some(Duration::from_secs(13)),
            reconnecting: None,
        };
        assert_eq!(
            progress_text(&progress),
            "model.safetensors (2 of 3)  \u{b7}  120 MB of 270 MB  \u{b7}  12 MB/s  \u{b7}  13 s left"
        );
        let single = DownloadProgress {
            file_count: 1,
            file_index: 1,
            bytes_total: None,
            bytes_per_sec: 0.0,
            eta: None,
            ..progress
        };
        assert_eq!(progress_text(&single), "model.safetensors  \u{b7}  120 MB");
        assert_eq!(time_left(Duration::from_secs(61)), "2 min left");
        assert_eq!(time_left(Duration::from_secs(3900)), "1 h 5 min left");
    }
}
