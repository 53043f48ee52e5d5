//! State of the Integrity view (being built).

use cortiq_engine::format::CmfFile;
use cortiq_views::Theme;
use ratatui::layout::Rect;
use ratatui::widgets::{Block, Paragraph};
use ratatui::Frame;

use super::jobs::JobReport;
use super::{Action, Ctx};

pub struct IntegrityState {}

impl IntegrityState {
    pub fn new(_file: &CmfFile) -> IntegrityState {
        IntegrityState {}
    }
    pub fn update(&mut self, _a: &Action, _ctx: &mut Ctx) {}
    pub fn typing(&self) -> bool {
        false
    }
    pub fn on_job(&mut self, _r: &JobReport) {}
    pub fn job_progress(&self) -> Option<(String, f64)> {
        None
    }
    pub fn status(&self, _file: &CmfFile) -> (String, String) {
        (String::new(), String::new())
    }
    pub fn render(&self, f: &mut Frame, area: Rect, _file: &CmfFile, _theme: &Theme) {
        f.render_widget(
            Paragraph::new("").block(Block::bordered().title(" integrity ")),
            area,
        );
    }
}
