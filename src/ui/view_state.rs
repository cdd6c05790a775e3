//! What only the window cares about (text being typed, which message is being edited), kept
//! apart from [`super::state::AppState`] so that the logic stays drawable-free.

use egui_commonmark::CommonMarkCache;

use super::file_dialog::{Dialog, Pick};
use super::turn_heights::TurnHeights;

#[derive(Default)]
pub struct ViewState {
    pub input: String,
    /// Set by the focus command; the input box takes focus on the next frame.
    pub focus_input: bool,
    /// Whether the input box had the keyboard at the end of the last frame: egui takes focus
    /// away on Esc before the frame's commands run, and Stop gives it back.
    pub input_focused: bool,
    /// The library's search box.
    pub hub_query: String,
    /// Set when the library opens; its first model's Open button takes focus on the next
    /// frame.
    pub focus_library: bool,
    /// Index and draft text of the user message being edited.
    pub editing: Option<(usize, String)>,
    /// Set by Edit and by Up in the empty message box; the edit box takes focus on the next
    /// frame.
    pub focus_edit: bool,
    /// Whether the keyboard shortcuts sheet is open.
    pub shortcuts_open: bool,
    /// The conversation list's search box; while it holds words, the list shows the chats
    /// that hold them.
    pub chat_query: String,
    /// Set by Ctrl+K; the search box takes focus on the next frame.
    pub focus_chat_search: bool,
    /// Whether the search box had the keyboard at the end of the last frame, for Esc.
    pub chat_search_focused: bool,
    /// Index and draft title of the conversation being renamed.
    pub renaming: Option<(usize, String)>,
    /// The first-run screen's and the settings panel's model folder field.
    pub model_path: String,
    pub markdown: CommonMarkCache,
    /// The open chat's messages' heights, for drawing only those on screen.
    pub turn_heights: TurnHeights,
    /// The system prompt box's text, and the conversation it belongs to.
    pub system_prompt: Option<(String, String)>,
    /// The name typed for a new system-prompt preset.
    pub preset_name: String,
    /// The name typed for a new folder in a chat's menu.
    pub new_folder: String,
    /// The window's inner size this frame, kept when it closes.
    pub window_size: Option<[f32; 2]>,
    /// Set by Quit; the window closes at the end of the frame.
    pub close_requested: bool,
    /// A dialog asked for; it opens at the end of the frame.
    pub dialog_requested: Option<Pick>,
    /// The dialog on screen, until the user answers it.
    pub dialog: Option<Dialog>,
}

impl ViewState {
    /// Opens user message `index` in its edit box with `text`, the keyboard there from the
    /// next frame: the Edit button's and Up's way in.
    pub fn start_editing(&mut self, index: usize, text: &str) {
        self.editing = Some((index, text.to_string()));
        self.focus_edit = true;
    }
}
