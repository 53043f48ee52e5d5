//! The one contract of a workbench tab: its state updates on Actions, takes worker reports,
//! renders itself as a pure function of that state, and names its status line. The app
//! dispatches through [`View`] alone, so a new tab is a new module and one line in
//! [`super::ModelScreen::view`].

use cortiq_engine::format::CmfFile;
use cortiq_views::Theme;
use ratatui::layout::Rect;
use ratatui::Frame;

use super::jobs::{JobKind, JobReport};
use super::{chat, compare, integrity, masks, overview, skills, tensors, Action, Ctx};

pub trait View {
    /// A key, mouse or command Action while this tab is shown.
    fn update(&mut self, a: &Action, ctx: &mut Ctx);
    /// A worker's report; every view sees every report, whatever tab is shown.
    fn on_job(&mut self, _r: &JobReport, _ctx: &mut Ctx) {}
    /// The status line and the key hint.
    fn status(&self, file: &CmfFile) -> (String, String);
    fn render(&self, f: &mut Frame, area: Rect, file: &CmfFile, theme: &Theme);
    /// Whether keys type into a field of the view.
    fn typing(&self) -> bool {
        false
    }
    /// Running background work: a label and its fraction done.
    fn job_progress(&self) -> Option<(String, f64)> {
        None
    }
}

impl View for overview::OverviewState {
    fn update(&mut self, a: &Action, ctx: &mut Ctx) {
        overview::OverviewState::update(self, a, ctx)
    }
    fn status(&self, file: &CmfFile) -> (String, String) {
        overview::OverviewState::status(self, file)
    }
    fn render(&self, f: &mut Frame, area: Rect, file: &CmfFile, theme: &Theme) {
        overview::OverviewState::render(self, f, area, file, theme)
    }
}

impl View for tensors::TensorsState {
    fn update(&mut self, a: &Action, ctx: &mut Ctx) {
        tensors::TensorsState::update(self, a, ctx)
    }
    fn on_job(&mut self, r: &JobReport, _ctx: &mut Ctx) {
        tensors::TensorsState::on_job(self, r)
    }
    fn status(&self, file: &CmfFile) -> (String, String) {
        tensors::TensorsState::status(self, file)
    }
    fn render(&self, f: &mut Frame, area: Rect, file: &CmfFile, theme: &Theme) {
        tensors::TensorsState::render(self, f, area, file, theme)
    }
    fn typing(&self) -> bool {
        tensors::TensorsState::typing(self)
    }
    fn job_progress(&self) -> Option<(String, f64)> {
        tensors::TensorsState::job_progress(self)
    }
}

impl View for masks::MasksState {
    fn update(&mut self, a: &Action, ctx: &mut Ctx) {
        masks::MasksState::update(self, a, ctx)
    }
    fn on_job(&mut self, r: &JobReport, _ctx: &mut Ctx) {
        if let JobReport::Chat(r) = r {
            self.on_report(r);
        }
    }
    fn status(&self, file: &CmfFile) -> (String, String) {
        masks::MasksState::status(self, file)
    }
    fn render(&self, f: &mut Frame, area: Rect, file: &CmfFile, theme: &Theme) {
        masks::MasksState::render(self, f, area, file, theme)
    }
}

impl View for skills::SkillsState {
    fn update(&mut self, a: &Action, ctx: &mut Ctx) {
        skills::SkillsState::update(self, a, ctx)
    }
    fn on_job(&mut self, r: &JobReport, ctx: &mut Ctx) {
        skills::SkillsState::on_job(self, r, ctx)
    }
    fn typing(&self) -> bool {
        skills::SkillsState::typing(self)
    }
    fn status(&self, file: &CmfFile) -> (String, String) {
        skills::SkillsState::status(self, file)
    }
    fn render(&self, f: &mut Frame, area: Rect, file: &CmfFile, theme: &Theme) {
        skills::SkillsState::render(self, f, area, file, theme)
    }
}

impl View for integrity::IntegrityState {
    fn update(&mut self, a: &Action, ctx: &mut Ctx) {
        integrity::IntegrityState::update(self, a, ctx)
    }
    fn on_job(&mut self, r: &JobReport, _ctx: &mut Ctx) {
        integrity::IntegrityState::on_job(self, r)
    }
    fn status(&self, file: &CmfFile) -> (String, String) {
        integrity::IntegrityState::status(self, file)
    }
    fn render(&self, f: &mut Frame, area: Rect, file: &CmfFile, theme: &Theme) {
        integrity::IntegrityState::render(self, f, area, file, theme)
    }
    fn job_progress(&self) -> Option<(String, f64)> {
        integrity::IntegrityState::job_progress(self)
    }
}

impl View for chat::ChatState {
    fn update(&mut self, a: &Action, ctx: &mut Ctx) {
        if let Some(msg) = chat::ChatState::update(self, a, ctx.page) {
            *ctx.flash = Some(msg);
        }
        for r in self.take_job_requests() {
            match r {
                chat::JobRequest::Compare(job) => {
                    ctx.jobs.spawn(JobKind::Compare, move |cancel, report| {
                        compare::run(&job, cancel, report)
                    })
                }
                chat::JobRequest::CancelCompare => ctx.jobs.cancel(JobKind::Compare),
            }
        }
    }
    fn on_job(&mut self, r: &JobReport, ctx: &mut Ctx) {
        let msg = match r {
            JobReport::Chat(r) => self.on_report(r),
            JobReport::Compare(r) => {
                let msg = self.on_compare(r);
                if !self.comparing() {
                    ctx.jobs.finished(JobKind::Compare);
                }
                msg
            }
            _ => None,
        };
        if let Some(msg) = msg {
            *ctx.flash = Some(msg);
        }
    }
    fn status(&self, _file: &CmfFile) -> (String, String) {
        chat::ChatState::status(self)
    }
    fn render(&self, f: &mut Frame, area: Rect, _file: &CmfFile, theme: &Theme) {
        chat::ChatState::render(self, f, area, theme)
    }
    fn typing(&self) -> bool {
        chat::ChatState::typing(self)
    }
}
