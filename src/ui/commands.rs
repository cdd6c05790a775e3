//! Every action that a menu, a button and a keyboard shortcut can trigger, in one enum so the
//! three always agree on name, shortcut and behaviour (the pattern of Rerun's `UICommand`).

use egui::{Key, KeyboardShortcut, Modifiers};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UiCommand {
    NewConversation,
    StopGeneration,
    FocusInput,
    ToggleSettings,
    ToggleTokenView,
    RegenerateLast,
    ExportMarkdown,
    ExportJson,
}

impl UiCommand {
    pub const ALL: [UiCommand; 8] = [
        UiCommand::NewConversation,
        UiCommand::StopGeneration,
        UiCommand::FocusInput,
        UiCommand::ToggleSettings,
        UiCommand::ToggleTokenView,
        UiCommand::RegenerateLast,
        UiCommand::ExportMarkdown,
        UiCommand::ExportJson,
    ];

    pub fn label(self) -> &'static str {
        match self {
            UiCommand::NewConversation => "New chat",
            UiCommand::StopGeneration => "Stop",
            UiCommand::FocusInput => "Focus message box",
            UiCommand::ToggleSettings => "Toggle settings",
            UiCommand::ToggleTokenView => "Toggle token probabilities",
            UiCommand::RegenerateLast => "Regenerate last reply",
            UiCommand::ExportMarkdown => "Export as Markdown",
            UiCommand::ExportJson => "Export as JSON",
        }
    }

    pub fn shortcut(self) -> Option<KeyboardShortcut> {
        let command = |key| Some(KeyboardShortcut::new(Modifiers::COMMAND, key));
        match self {
            UiCommand::NewConversation => command(Key::N),
            UiCommand::StopGeneration => Some(KeyboardShortcut::new(Modifiers::NONE, Key::Escape)),
            UiCommand::FocusInput => command(Key::L),
            UiCommand::ToggleSettings => command(Key::Comma),
            UiCommand::ToggleTokenView => command(Key::T),
            UiCommand::RegenerateLast => command(Key::R),
            UiCommand::ExportMarkdown | UiCommand::ExportJson => None,
        }
    }

    /// The label with its shortcut, for tooltips and screen readers.
    pub fn description(self, ctx: &egui::Context) -> String {
        match self.shortcut() {
            Some(shortcut) => format!("{} ({})", self.label(), ctx.format_shortcut(&shortcut)),
            None => self.label().to_string(),
        }
    }

    /// The commands whose shortcut was pressed this frame (the key presses are consumed).
    pub fn pressed(ctx: &egui::Context) -> Vec<UiCommand> {
        ctx.input_mut(|input| {
            UiCommand::ALL
                .into_iter()
                .filter(|command| {
                    command
                        .shortcut()
                        .is_some_and(|shortcut| input.consume_shortcut(&shortcut))
                })
                .collect()
        })
    }
}
