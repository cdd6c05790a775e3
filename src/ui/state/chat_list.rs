//! The chats as a list: start, pick, rename, sort into folders, fork, delete to the trash and
//! back.

use std::time::SystemTime;

use super::AppState;
use crate::store::{Conversation, Trashed};

impl AppState {
    /// Opens an empty conversation: the current one if it is empty, else the first empty one,
    /// else a new one at the top.
    pub(super) fn new_conversation(&mut self) -> bool {
        if self.current().messages.is_empty() {
            return true;
        }
        if let Some(index) = self
            .conversations
            .iter()
            .position(|c| c.messages.is_empty())
        {
            self.current = index;
            return true;
        }
        self.conversations.insert(0, Conversation::new());
        // The current conversation moved down one.
        self.current += 1;
        self.select(0)
    }

    pub(super) fn select(&mut self, index: usize) -> bool {
        let exists = index < self.conversations.len();
        // A chat picked in the list is shown, in place of the trash.
        self.trash_open &= !exists;
        if exists && index != self.current {
            self.current = index;
            // The last reply's figures belong to the conversation it was written in; a
            // running reply's stay until it ends.
            if !self.is_generating() {
                self.live = None;
            }
        }
        exists
    }

    pub(super) fn rename(&mut self, index: usize, title: &str) -> bool {
        let title = title.trim();
        let Some(conversation) = self.conversations.get_mut(index) else {
            return false;
        };
        if title.is_empty() {
            return false;
        }
        conversation.title = title.to_string();
        let conversation = conversation.clone();
        self.save(&conversation)
    }

    pub(super) fn delete(&mut self, index: usize) -> bool {
        let Some(conversation) = self.conversations.get(index) else {
            return false;
        };
        let streaming_here = self
            .generation
            .as_ref()
            .is_some_and(|active| active.conversation_id == conversation.id);
        if streaming_here {
            self.notify("Stop the reply before deleting its conversation.");
            return false;
        }
        if let Err(err) = self.store.delete(&conversation.id) {
            self.errors.push(format!(
                "cannot delete the conversation file: {err}. Check the permissions of {}.",
                self.paths.conversations_dir().display()
            ));
            return false;
        }
        let active_id = self.current().id.clone();
        let removed = self.conversations.remove(index);
        if self.conversations.is_empty() {
            self.conversations.push(Conversation::new());
        }
        self.current = self
            .conversations
            .iter()
            .position(|c| c.id == active_id)
            .unwrap_or(0);
        self.notify(deleted_notice(&removed));
        self.deleted = Some(removed.id.clone());
        self.trash.insert(
            0,
            Trashed {
                conversation: removed,
                deleted: SystemTime::now(),
            },
        );
        true
    }

    pub(super) fn undo_delete(&mut self) -> bool {
        match self.deleted.take() {
            Some(id) => self.restore(&id),
            None => false,
        }
    }

    /// Brings conversation `id` back from the trash to its place in the list.
    pub(super) fn restore(&mut self, id: &str) -> bool {
        let Some(index) = self.trash.iter().position(|t| t.conversation.id == id) else {
            return false;
        };
        if let Err(err) = self.store.restore(id) {
            self.errors.push(format!(
                "cannot restore \u{201c}{}\u{201d}: {err}. Check the permissions of {}.",
                self.trash[index].conversation.title,
                self.paths.conversations_dir().display()
            ));
            return false;
        }
        let conversation = self.trash.remove(index).conversation;
        self.trash_open &= !self.trash.is_empty();
        if self.deleted.as_deref() == Some(id) {
            self.deleted = None;
        }
        let notice = deleted_notice(&conversation);
        self.withdraw_notice(&notice);
        self.insert_by_date(conversation);
        true
    }

    /// Puts `conversation` in its place in the list, newest first, the current chat staying
    /// current; returns where it went.
    pub(super) fn insert_by_date(&mut self, conversation: Conversation) -> usize {
        let position = self
            .conversations
            .iter()
            .position(|c| c.created_unix_ms < conversation.created_unix_ms)
            .unwrap_or(self.conversations.len());
        if position <= self.current {
            self.current += 1;
        }
        self.conversations.insert(position, conversation);
        position
    }

    /// The chats in the order the list shows them: each folder's (folders by name), then
    /// those in none; newest first within each. Ctrl+Tab and Ctrl+1…9 follow it.
    pub fn chat_order(&self) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.conversations.len()).collect();
        // Stable: within a folder the list's own order (newest first) stays.
        order.sort_by_key(|&index| {
            let folder = self.conversations[index].folder.as_deref();
            (folder.is_none(), folder)
        });
        order
    }

    /// The folders chats are in, by name, each once.
    pub fn folders(&self) -> Vec<&str> {
        let mut folders: Vec<&str> = self
            .conversations
            .iter()
            .filter_map(|c| c.folder.as_deref())
            .collect();
        folders.sort_unstable();
        folders.dedup();
        folders
    }

    /// Puts chat `index` in `folder` (made by naming it), or in none.
    pub(super) fn move_to_folder(&mut self, index: usize, folder: Option<&str>) -> bool {
        let folder = folder.map(str::trim).filter(|name| !name.is_empty());
        let Some(conversation) = self.conversations.get_mut(index) else {
            return false;
        };
        conversation.folder = folder.map(str::to_string);
        let conversation = conversation.clone();
        self.save(&conversation)
    }

    /// Takes every chat out of `folder`, which then is no more; the chats stay.
    pub(super) fn remove_folder(&mut self, folder: &str) -> bool {
        let inside: Vec<usize> = (0..self.conversations.len())
            .filter(|&index| self.conversations[index].folder.as_deref() == Some(folder))
            .collect();
        let mut all_saved = !inside.is_empty();
        for index in inside {
            all_saved &= self.move_to_folder(index, None);
        }
        all_saved
    }

    /// Starts a chat of its own with the current one's messages up to `index` (as shown,
    /// with their other versions), its system prompt and thinking switch, and opens it.
    pub(super) fn fork(&mut self, index: usize) -> bool {
        let source = self.current();
        if index >= source.messages.len() {
            return false;
        }
        if self.is_generating() {
            self.notify("A reply is still being written; stop it first (Esc).");
            return false;
        }
        let forked = Conversation {
            title: format!("{} (fork)", source.title),
            system_prompt: source.system_prompt.clone(),
            thinking: source.thinking,
            sampling: source.sampling.clone(),
            folder: source.folder.clone(),
            messages: source.messages[..=index].to_vec(),
            ..Conversation::new()
        };
        if !self.save(&forked) {
            return false;
        }
        self.conversations.insert(0, forked);
        self.current += 1;
        self.select(0)
    }

    /// Deletes conversation `id` from the trash for good, or every one in it.
    pub(super) fn delete_forever(&mut self, id: Option<&str>) -> bool {
        let ids: Vec<String> = self
            .trash
            .iter()
            .map(|t| t.conversation.id.clone())
            .filter(|trashed| id.is_none_or(|id| id == trashed))
            .collect();
        for id in &ids {
            if let Err(err) = self.store.delete_forever(id) {
                self.errors.push(format!(
                    "cannot delete a chat from the trash: {err}. Check the permissions of {}.",
                    self.paths.conversations_dir().display()
                ));
                return false;
            }
            self.trash.retain(|t| t.conversation.id != *id);
            if self.deleted.as_deref() == Some(id.as_str()) {
                self.deleted = None;
            }
        }
        self.trash_open &= !self.trash.is_empty();
        !ids.is_empty()
    }
}

/// The notice a deletion shows; undoing the deletion takes it back.
fn deleted_notice(conversation: &Conversation) -> String {
    format!("Deleted \u{201c}{}\u{201d}.", conversation.title)
}
