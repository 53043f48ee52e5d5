//! The workbench's widgets: every function here renders a view model into a ratatui
//! frame and nothing else — no files, no threads, no state beyond its arguments — so each
//! view is a pure function of what the app hands it and can be snapshot-tested.

pub mod chrome;
pub mod theme;
pub mod util;

pub use theme::Theme;
pub mod chat;
pub mod choice;
pub mod integrity;
pub mod markdown;
pub mod masks;
pub mod overview;
pub mod routing;
pub mod skills;
pub mod tensors;
