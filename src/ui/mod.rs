//! The desktop window: state and actions in [`state`], one module per part of the screen.

mod app;
mod chat_search;
mod chat_view;
pub mod commands;
mod conversation_list;
mod downloads;
mod file_dialog;
mod first_run;
mod fonts;
mod input;
mod library;
mod local_server;
#[cfg(test)]
mod scripted_engine;
mod settings_panel;
pub mod state;
mod stats_plot;
mod status_bar;
mod theme;
mod token_view;
mod trash;
mod turn_heights;
mod view_state;

pub use app::{SmolchatApp, run};
pub use commands::{Action, ExportFormat, UiCommand};
pub use local_server::ServerStatus;
pub use state::{AppState, ModelStatus};
pub use view_state::ViewState;

/// Accessible names for widgets that tests and screen readers look up.
pub mod labels {
    pub const MESSAGE_INPUT: &str = "Message";
    pub const SEND: &str = "Send";
    pub const STOP: &str = "Stop";
    pub const TEMPERATURE: &str = "Temperature";
    pub const TOP_P: &str = "Top-p";
    pub const MAX_NEW_TOKENS: &str = "Max new tokens";
    pub const DOWNLOAD_DEFAULT: &str = "Download SmolLM2-135M-Instruct";
    pub const MODEL_FOLDER: &str = "Model file or folder";
    /// The settings panel's model field, beside the first-run screen's.
    pub const CURRENT_MODEL: &str = "Current model";
    pub const USE_FOLDER: &str = "Use this model";
    pub const NO_MODEL_HEADING: &str = "No model yet";
    /// The first-run screen's list of the models found on this machine, and its buttons.
    pub const ON_THIS_COMPUTER: &str = "On this computer";
    pub const OPEN_LOCAL_MODEL: &str = "Open";
    pub const SERVE_ON_LOCALHOST: &str = "Serve on localhost";
    pub const CONVERSATION_MEMORY: &str = "Memory for conversations";
}
