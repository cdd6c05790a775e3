//! The desktop's own open dialog (through the XDG portal on Linux), on a thread of its own:
//! it blocks until the user answers, and the window keeps drawing meanwhile.

use std::path::PathBuf;

use crossbeam_channel::{Receiver, TryRecvError};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick {
    GgufFile,
    ModelFolder,
}

/// A dialog the user has not answered yet.
pub struct OpenDialog(Receiver<Option<PathBuf>>);

impl OpenDialog {
    /// Opens the dialog; `ctx` is woken when it closes. `None` when no thread could be
    /// started for it.
    pub fn open(pick: Pick, ctx: egui::Context) -> Option<Self> {
        let (answer, answered) = crossbeam_channel::bounded(1);
        std::thread::Builder::new()
            .name("smolchat-dialog".into())
            .spawn(move || {
                let dialog = rfd::FileDialog::new();
                let path = match pick {
                    Pick::GgufFile => dialog
                        .set_title("Open a GGUF model file")
                        .add_filter("GGUF model", &["gguf", "GGUF"])
                        .pick_file(),
                    Pick::ModelFolder => dialog
                        .set_title("Open a model folder (config.json, weights, tokenizer)")
                        .pick_folder(),
                };
                let _ = answer.send(path);
                ctx.request_repaint();
            })
            .ok()?;
        Some(Self(answered))
    }

    /// `Some` once the dialog closed: the path chosen, or `None` when it was cancelled (or
    /// the desktop has no dialog to show).
    pub fn answer(&self) -> Option<Option<PathBuf>> {
        match self.0.try_recv() {
            Ok(path) => Some(path),
            Err(TryRecvError::Empty) => None,
            Err(TryRecvError::Disconnected) => Some(None),
        }
    }
}
