//! The desktop's own open and save dialogs (through the XDG portal on Linux), each on a
//! thread of its own: a dialog blocks until the user answers, and the window keeps drawing
//! meanwhile.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, TryRecvError};

use super::commands::ExportFormat;
use crate::model_files::GGUF_EXTENSIONS;

#[derive(Debug, Clone, PartialEq)]
pub enum Pick {
    GgufFile,
    ModelFolder,
    /// Where to save the current conversation; `suggested` names the folder and file the
    /// dialog starts from.
    Export {
        format: ExportFormat,
        suggested: PathBuf,
    },
    /// A chat's JSON export to import.
    ChatExport,
}

/// A dialog the user has not answered yet.
pub struct Dialog {
    pick: Pick,
    answer: Receiver<Option<PathBuf>>,
    opened: Instant,
}

/// How a dialog closed.
#[derive(Debug, PartialEq)]
pub enum Answer {
    Chosen(PathBuf),
    Cancelled,
    /// No dialog was shown: without an XDG desktop portal (a bare X session, some tiling
    /// window managers) rfd answers "cancelled" at once.
    NotShown,
}

/// A dialog that comes back empty sooner than this was never on screen: no one cancels one
/// that fast.
const SHOWN_AT_LEAST: Duration = Duration::from_millis(400);

impl Answer {
    fn of(path: Option<PathBuf>, open_for: Duration) -> Self {
        match path {
            Some(path) => Self::Chosen(path),
            None if open_for < SHOWN_AT_LEAST => Self::NotShown,
            None => Self::Cancelled,
        }
    }
}

impl Dialog {
    /// Opens the dialog; `ctx` is woken when it closes. `None` when no thread could be
    /// started for it.
    pub fn open(pick: Pick, ctx: egui::Context) -> Option<Self> {
        let (answer, answered) = crossbeam_channel::bounded(1);
        let asked = pick.clone();
        std::thread::Builder::new()
            .name("smolchat-dialog".into())
            .spawn(move || {
                let dialog = rfd::FileDialog::new();
                let path = match asked {
                    Pick::GgufFile => dialog
                        .set_title("Open a GGUF model file")
                        .add_filter("GGUF model", &GGUF_EXTENSIONS)
                        .pick_file(),
                    Pick::ModelFolder => dialog
                        .set_title("Open a model folder (config.json, weights, tokenizer)")
                        .pick_folder(),
                    Pick::ChatExport => dialog
                        .set_title("Import a chat exported as JSON")
                        .add_filter("JSON", &["json"])
                        .pick_file(),
                    Pick::Export { format, suggested } => {
                        let (name, extension) = match format {
                            ExportFormat::Markdown => ("Markdown", "md"),
                            ExportFormat::Json => ("JSON", "json"),
                        };
                        let mut dialog = dialog
                            .set_title("Save the conversation")
                            .add_filter(name, &[extension]);
                        if let Some(folder) = suggested.parent() {
                            dialog = dialog.set_directory(folder);
                        }
                        if let Some(file) = suggested.file_name() {
                            dialog = dialog.set_file_name(file.to_string_lossy());
                        }
                        dialog.save_file()
                    }
                };
                let _ = answer.send(path);
                ctx.request_repaint();
            })
            .ok()?;
        Some(Self {
            pick,
            answer: answered,
            opened: Instant::now(),
        })
    }

    pub fn pick(&self) -> &Pick {
        &self.pick
    }

    /// `Some` once the dialog closed.
    pub fn answer(&self) -> Option<Answer> {
        let path = match self.answer.try_recv() {
            Ok(path) => path,
            Err(TryRecvError::Empty) => return None,
            Err(TryRecvError::Disconnected) => None,
        };
        Some(Answer::of(path, self.opened.elapsed()))
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use super::Answer;

    #[test]
    fn an_empty_answer_at_once_means_no_dialog_was_shown() {
        let path = PathBuf::from("/models/m.gguf");
        assert_eq!(
            Answer::of(Some(path.clone()), Duration::from_millis(5)),
            Answer::Chosen(path)
        );
        assert_eq!(
            Answer::of(None, Duration::from_millis(20)),
            Answer::NotShown
        );
        assert_eq!(Answer::of(None, Duration::from_secs(3)), Answer::Cancelled);
    }
}
