//! Every way the user changes the window's state, as values: [`UiCommand`] for the actions a
//! menu, a button and a keyboard shortcut share, [`Action`] for everything a view asks for,
//! data included. Views push them; [`super::SmolchatApp::execute`] runs them, and
//! [`super::AppState::apply`] is the one place that changes the state (the pattern of Rerun's
//! `UICommand` and egui_demo_app's panels).

use std::path::PathBuf;

use egui::{Key, KeyboardShortcut, Modifiers};
use strum::IntoEnumIterator;

use crate::store::Settings;
use crate::text::SamplingParams;

/// What a file dialog was asked for: what to do instead where none appears.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DialogFor {
    OpeningModel,
    Export,
    ImportingChat,
}

/// Declared in menu order: the menus list [`UiCommand::iter`] filtered by [`UiCommand::menu`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::EnumIter)]
pub enum UiCommand {
    NewConversation,
    /// Writes another reply to the last turn; the earlier ones stay, one click away.
    RegenerateLast,
    /// Extends the last reply where it was stopped or cut short.
    ContinueLast,
    /// The last turn's previous reply ("‹"), and its next ("›").
    PreviousReply,
    NextReply,
    /// Stops the running reply, or the download.
    StopGeneration,
    /// Into the exports folder, at once.
    ExportMarkdown,
    ExportJson,
    /// Where the user chooses, in the desktop's save dialog.
    ExportMarkdownAs,
    ExportJsonAs,
    /// A chat exported as JSON (by this or another smolchat), added to the list.
    ImportChat,
    OpenModelFile,
    OpenModelFolder,
    /// The chat below the current one in the list, and above it (wrapping around). The
    /// previous one is declared first: its shortcut, with Shift, would match the next's too.
    PreviousChat,
    NextChat,
    /// Opens the current chat's title for editing in the conversation list.
    RenameChat,
    /// Gives the keyboard to the conversation list's search box.
    SearchChats,
    FocusInput,
    ToggleConversations,
    ToggleSettings,
    /// Every model on this computer, in place of the chat.
    ToggleLibrary,
    /// Deleted chats, restorable for 30 days, in place of the chat.
    ToggleTrash,
    ToggleTokenView,
    /// "Serve on localhost": the loaded model answers OpenAI's API for other programs.
    ToggleServer,
    ThemeSystem,
    ThemeLight,
    ThemeDark,
    /// Closes the window; the draft and the window's size are kept for next time.
    Quit,
    /// Every keyboard shortcut, on one sheet.
    ShowShortcuts,
}

/// The menu bar's menus, in their order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::EnumIter)]
pub enum Menu {
    Chat,
    View,
    Help,
}

impl Menu {
    pub fn label(self) -> &'static str {
        match self {
            Menu::Chat => "Chat",
            Menu::View => "View",
            Menu::Help => "Help",
        }
    }
}

impl UiCommand {
    pub fn label(self) -> &'static str {
        match self {
            UiCommand::NewConversation => "New chat",
            UiCommand::StopGeneration => "Stop",
            UiCommand::FocusInput => "Focus message box",
            // Switches: the menus mark them with a check when on.
            UiCommand::ToggleConversations => "Conversation list",
            UiCommand::ToggleSettings => "Settings panel",
            UiCommand::ToggleLibrary => "Model library",
            UiCommand::ToggleTrash => "Trash",
            UiCommand::ToggleTokenView => "Token probabilities",
            UiCommand::RegenerateLast => "Regenerate last reply",
            UiCommand::ContinueLast => "Continue last reply",
            UiCommand::PreviousReply => "Previous reply",
            UiCommand::NextReply => "Next reply",
            UiCommand::ExportMarkdown => "Export as Markdown",
            UiCommand::ExportJson => "Export as JSON",
            UiCommand::ExportMarkdownAs => "Save as Markdown\u{2026}",
            UiCommand::ExportJsonAs => "Save as JSON\u{2026}",
            UiCommand::ImportChat => "Import chat\u{2026}",
            UiCommand::OpenModelFile => "Open model file\u{2026}",
            UiCommand::OpenModelFolder => "Open model folder\u{2026}",
            UiCommand::ToggleServer => super::labels::SERVE_ON_LOCALHOST,
            UiCommand::Quit => "Quit",
            UiCommand::ThemeSystem => "Theme: as the system",
            UiCommand::ThemeLight => "Theme: light",
            UiCommand::ThemeDark => "Theme: dark",
            UiCommand::PreviousChat => "Previous chat",
            UiCommand::NextChat => "Next chat",
            UiCommand::RenameChat => "Rename chat",
            UiCommand::SearchChats => "Search chats",
            UiCommand::ShowShortcuts => "Keyboard shortcuts",
        }
    }

    pub fn menu(self) -> Menu {
        match self {
            UiCommand::NewConversation
            | UiCommand::RegenerateLast
            | UiCommand::ContinueLast
            | UiCommand::PreviousReply
            | UiCommand::NextReply
            | UiCommand::StopGeneration
            | UiCommand::ExportMarkdown
            | UiCommand::ExportJson
            | UiCommand::ExportMarkdownAs
            | UiCommand::ExportJsonAs
            | UiCommand::ImportChat
            | UiCommand::OpenModelFile
            | UiCommand::OpenModelFolder
            | UiCommand::RenameChat
            | UiCommand::SearchChats
            | UiCommand::Quit => Menu::Chat,
            UiCommand::ShowShortcuts => Menu::Help,
            UiCommand::FocusInput
            | UiCommand::PreviousChat
            | UiCommand::NextChat
            | UiCommand::ToggleConversations
            | UiCommand::ToggleSettings
            | UiCommand::ToggleLibrary
            | UiCommand::ToggleTrash
            | UiCommand::ToggleTokenView
            | UiCommand::ToggleServer
            | UiCommand::ThemeSystem
            | UiCommand::ThemeLight
            | UiCommand::ThemeDark => Menu::View,
        }
    }

    pub fn shortcut(self) -> Option<KeyboardShortcut> {
        let command = |key| Some(KeyboardShortcut::new(Modifiers::COMMAND, key));
        match self {
            UiCommand::NewConversation => command(Key::N),
            UiCommand::StopGeneration => Some(KeyboardShortcut::new(Modifiers::NONE, Key::Escape)),
            UiCommand::FocusInput => command(Key::L),
            UiCommand::ToggleConversations => command(Key::B),
            UiCommand::ToggleSettings => command(Key::Comma),
            UiCommand::ToggleLibrary => command(Key::M),
            UiCommand::Quit => command(Key::Q),
            UiCommand::OpenModelFile => command(Key::O),
            UiCommand::ToggleTokenView => command(Key::T),
            UiCommand::RegenerateLast => command(Key::R),
            UiCommand::ContinueLast => command(Key::E),
            UiCommand::PreviousReply => Some(KeyboardShortcut::new(Modifiers::ALT, Key::ArrowLeft)),
            UiCommand::NextReply => Some(KeyboardShortcut::new(Modifiers::ALT, Key::ArrowRight)),
            UiCommand::PreviousChat => Some(KeyboardShortcut::new(
                Modifiers::COMMAND | Modifiers::SHIFT,
                Key::Tab,
            )),
            UiCommand::NextChat => command(Key::Tab),
            UiCommand::RenameChat => Some(KeyboardShortcut::new(Modifiers::NONE, Key::F2)),
            UiCommand::SearchChats => command(Key::K),
            UiCommand::ShowShortcuts => Some(KeyboardShortcut::new(Modifiers::NONE, Key::F1)),
            UiCommand::ExportMarkdown
            | UiCommand::ExportJson
            | UiCommand::ExportMarkdownAs
            | UiCommand::ExportJsonAs
            | UiCommand::ImportChat
            | UiCommand::ToggleServer
            | UiCommand::ToggleTrash
            | UiCommand::OpenModelFolder
            | UiCommand::ThemeSystem
            | UiCommand::ThemeLight
            | UiCommand::ThemeDark => None,
        }
    }

    /// The label with its shortcut, for tooltips and screen readers.
    pub fn description(self, ctx: &egui::Context) -> String {
        match self.shortcut() {
            Some(shortcut) => format!("{} ({})", self.label(), ctx.format_shortcut(&shortcut)),
            None => self.label().to_string(),
        }
    }

    /// Ctrl+1 to Ctrl+9 this frame, as the chat at that place in the list (the key press is
    /// consumed).
    pub fn chat_number_pressed(ctx: &egui::Context) -> Option<usize> {
        ctx.input_mut(|input| {
            CHAT_NUMBER_KEYS.iter().position(|&key| {
                input.consume_shortcut(&KeyboardShortcut::new(Modifiers::COMMAND, key))
            })
        })
    }

    /// The commands whose shortcut was pressed this frame (the key presses are consumed).
    pub fn pressed(ctx: &egui::Context) -> Vec<UiCommand> {
        ctx.input_mut(|input| {
            UiCommand::iter()
                .filter(|command| {
                    command
                        .shortcut()
                        .is_some_and(|shortcut| input.consume_shortcut(&shortcut))
                })
                .collect()
        })
    }
}

/// The keys that, with Ctrl (Cmd on macOS), open the first nine chats.
const CHAT_NUMBER_KEYS: [Key; 9] = [
    Key::Num1,
    Key::Num2,
    Key::Num3,
    Key::Num4,
    Key::Num5,
    Key::Num6,
    Key::Num7,
    Key::Num8,
    Key::Num9,
];

/// Keys that belong to one widget rather than a command, for the shortcuts sheet.
pub const WIDGET_KEYS: [(&str, &str); 7] = [
    ("Enter", "Send the message"),
    ("Shift+Enter", "New line in the message"),
    ("Up", "Edit your last message (from the empty message box)"),
    ("Ctrl+Enter", "Resend an edited message"),
    (
        "Ctrl+1 \u{2026} Ctrl+9",
        "Open the chat at that place in the list",
    ),
    ("Enter or Esc", "Finish renaming a chat"),
    (
        "Delete",
        "Delete the chat that has the keyboard in the list",
    ),
];

/// What a view asks for. The data is what the view holds when it asks (the text typed, the
/// index clicked), so running an action needs nothing from the view afterwards.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Command(UiCommand),
    /// The user's message; refused (and kept in the box) while a reply is being written.
    Send(String),
    Select(usize),
    Rename(usize, String),
    /// Deletes a conversation; [`Action::UndoDelete`] brings it back until the next deletion.
    Delete(usize),
    UndoDelete,
    /// Brings a deleted conversation (by id) back from the trash.
    Restore(String),
    /// Deletes a conversation (by id) from the trash for good.
    DeleteForever(String),
    EmptyTrash,
    /// Replaces user message `.0` of the current conversation and replies anew; the message
    /// as it was stays as its earlier version.
    EditAndResend(usize, String),
    /// Shows version `.1` of message `.0` of the current conversation (see
    /// [`crate::store::Conversation::show_variant`]).
    ShowVariant(usize, usize),
    /// Starts a new chat with the current one's messages up to `.0`.
    Fork(usize),
    /// Puts chat `.0` in folder `.1` (a new name makes the folder), or in none.
    MoveToFolder(usize, Option<String>),
    /// Takes every chat out of this folder.
    RemoveFolder(String),
    /// The current chat's system prompt, used from its next reply on.
    SetSystemPrompt(String),
    /// Whether a reasoning model thinks before answering in the current chat.
    SetThinking(bool),
    /// The current chat's own sampling; `None` goes back to the settings' defaults.
    SetChatSampling(Option<SamplingParams>),
    /// Saves the current chat's system prompt as a preset of this name.
    SavePreset(String),
    DeletePreset(usize),
    UseModelFolder(PathBuf),
    DownloadDefaultModel,
    /// Looks on the hub for repositories matching the words.
    SearchHub(String),
    /// Lists a hub repository's files.
    ListHubFiles(String),
    /// Puts `org/name` or `org/name:QUANT` in the download queue.
    QueueDownload(String),
    PauseDownload(u64),
    ResumeDownload(u64),
    /// Stops a download and deletes what came, or takes a finished one off the list.
    CancelDownload(u64),
    /// The settings as the panel left them; a new backend or precision reloads the model.
    /// Their model folder is ignored: a folder is checked first, by [`Action::UseModelFolder`].
    UpdateSettings(Settings),
    DismissError(usize),
    DismissNotice(usize),
    /// Writes the current conversation to a file the user chose.
    ExportTo(ExportFormat, PathBuf),
    /// The desktop showed no file dialog for this.
    NoFileDialog(DialogFor),
    /// Adds the chat in a JSON export (ours) to the list.
    ImportFrom(PathBuf),
    /// Keeps the window's size and the current chat's unsent message for the next start
    /// (on closing).
    RememberWindow {
        size: Option<[f32; 2]>,
        draft: String,
    },
    /// The unsent message of conversation `conversation` (by id), kept with it when the
    /// window moves to another chat.
    KeepDraft {
        conversation: String,
        draft: String,
    },
}

impl From<UiCommand> for Action {
    fn from(command: UiCommand) -> Self {
        Action::Command(command)
    }
}

/// The file formats a chat is exported in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportFormat {
    Markdown,
    Json,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Presses `shortcut` in a frame and returns the commands that fired.
    fn press(ctx: &egui::Context, shortcut: KeyboardShortcut) -> Vec<UiCommand> {
        // As a Linux or Windows keyboard reports Ctrl: both `ctrl` and `command` are set.
        let mut modifiers = shortcut.modifiers;
        modifiers.ctrl |= modifiers.command;
        let input = egui::RawInput {
            events: vec![egui::Event::Key {
                key: shortcut.logical_key,
                physical_key: None,
                pressed: true,
                repeat: false,
                modifiers,
            }],
            ..Default::default()
        };
        let mut fired = Vec::new();
        let mut output = ctx.run_ui(input, |ui| fired = UiCommand::pressed(ui.ctx()));
        // Nothing is drawn here; epaint insists the font texture be handled or cleared.
        output.textures_delta.clear();
        fired
    }

    #[test]
    fn every_shortcut_fires_its_command_and_only_it() {
        let ctx = egui::Context::default();
        let mut with_shortcut = 0;
        for command in UiCommand::iter() {
            if let Some(shortcut) = command.shortcut() {
                assert_eq!(press(&ctx, shortcut), [command], "{shortcut:?}");
                with_shortcut += 1;
            }
        }
        assert!(with_shortcut > 0);
    }
}
