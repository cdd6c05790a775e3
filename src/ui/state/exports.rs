//! One chat as a file: exported as Markdown or JSON, and our own JSON read back in.

use std::path::{Path, PathBuf};

use super::AppState;
use crate::store::{Conversation, ConversationStore};
use crate::ui::commands::ExportFormat;

impl AppState {
    /// Adds the chat exported to `path` (as JSON, by this or another smolchat) to the list,
    /// and opens it. A chat that is here already keeps its file: the copy gets an id of its
    /// own.
    pub(super) fn import_from(&mut self, path: &Path) -> bool {
        let (mut conversation, left_out) = match ConversationStore::load_file(path) {
            Ok(loaded) => loaded,
            Err(problem) => {
                self.errors.push(format!(
                    "Cannot import: {problem}. A chat exported as JSON by smolchat can be \
                     imported."
                ));
                return false;
            }
        };
        self.errors.extend(left_out);
        let taken = |id: &str| {
            self.conversations.iter().any(|c| c.id == id)
                || self.trash.iter().any(|t| t.conversation.id == id)
        };
        if taken(&conversation.id) {
            conversation.id = Conversation::new().id;
        }
        conversation.draft.clear();
        if !self.save(&conversation) {
            return false;
        }
        self.notify(format!("Imported \u{201c}{}\u{201d}.", conversation.title));
        let position = self.insert_by_date(conversation);
        self.select(position)
    }

    /// Where the current conversation is exported to in `format`, in the exports folder.
    pub fn export_path(&self, format: ExportFormat) -> PathBuf {
        let conversation = self.current();
        let stem: String = conversation
            .title
            .chars()
            .map(|c| if c.is_alphanumeric() { c } else { '-' })
            .collect();
        let extension = match format {
            ExportFormat::Markdown => "md",
            ExportFormat::Json => "json",
        };
        self.paths
            .data_dir
            .join("exports")
            .join(format!("{stem}-{}.{extension}", conversation.id))
    }

    pub(super) fn export_current(&mut self, format: ExportFormat) -> bool {
        let path = self.export_path(format);
        self.export_to(format, path)
    }

    /// Writes the current conversation in `format` to `path` (chosen in a save dialog, or the
    /// exports folder).
    pub(super) fn export_to(&mut self, format: ExportFormat, path: PathBuf) -> bool {
        let conversation = self.current();
        let bytes = match format {
            ExportFormat::Markdown => {
                Ok(conversation.to_markdown(self.system_prompt()).into_bytes())
            }
            ExportFormat::Json => conversation.to_json(),
        };
        match bytes.and_then(|bytes| crate::atomic_file::write_atomic(&path, &bytes)) {
            Ok(()) => {
                self.notify(format!("Exported to {}", path.display()));
                true
            }
            Err(err) => {
                self.errors.push(format!(
                    "cannot export to {}: {err}. Check that the folder is writable.",
                    path.display()
                ));
                false
            }
        }
    }
}
