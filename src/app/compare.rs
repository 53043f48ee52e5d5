//! Compare mode of the chat: one prompt answered under two choices (task mask and skill),
//! greedy, side by side, with the first token where the answers part. A background job
//! runs the two answers one after the other, each in a session of its own on the chat
//! worker's model (shared, not loaded again); it waits while a chat answer streams, so
//! the engine's pool is never oversubscribed, and stops at its cancel flag.

use std::sync::atomic::{AtomicBool, Ordering};

use cortiq_engine::chat::conversation::{Conversation, ReplyStep, Settings};
use cortiq_engine::exec::yield_to_foreground;
use cortiq_engine::runtime::choice::{resolve, Request};
use cortiq_engine::runtime::sampler::SamplingParams;
use cortiq_engine::runtime::session::{StopReason, SwitchPolicy};

use super::chat_worker::{SharedEngine, CHAT_CONTEXT};
use super::choice::{request_text, Choices, BLEND_T};
use super::jobs::JobReport;

/// A step of one side of a compare run.
#[derive(Clone, Debug, PartialEq)]
pub enum CompareStep {
    /// The side's session runs under `label` (the engine's label of the choice).
    Started {
        label: String,
        warnings: Vec<String>,
    },
    /// A generated token and the text it completed.
    Token {
        id: u32,
        text: String,
    },
    Done {
        stop: StopReason,
    },
    Failed(String),
}

#[derive(Clone, Debug, PartialEq)]
pub struct CompareReport {
    /// The run it belongs to: reports of an older run are dropped.
    pub run: u64,
    /// 0 = A, 1 = B.
    pub side: usize,
    pub step: CompareStep,
}

/// One side's answer as it comes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CompareSide {
    pub label: Option<String>,
    pub ids: Vec<u32>,
    pub texts: Vec<String>,
    pub stop: Option<StopReason>,
    pub error: Option<String>,
}

impl CompareSide {
    pub fn finished(&self) -> bool {
        self.stop.is_some() || self.error.is_some()
    }
}

/// Where two answers part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Divergence {
    /// Not known yet (a side is still running and they agree so far).
    Pending,
    /// Both ended with the same tokens.
    Same(usize),
    /// The first token index where they differ (or where the shorter one ended).
    At(usize),
}

/// The compare panel: its setting rows, the prompt and the two answers.
#[derive(Clone, Debug, PartialEq)]
pub struct CompareState {
    /// The selected setting row: 0 A task, 1 A skill, 2 B task, 3 B skill.
    pub row: usize,
    /// Per side: task picker row, skill picker row (see [`Choices`]).
    pub sel: [(usize, usize); 2],
    pub prompt: String,
    pub run: u64,
    pub running: bool,
    pub sides: [CompareSide; 2],
}

pub const ROWS: [&str; 4] = ["A task", "A skill", "B task", "B skill"];

impl CompareState {
    /// A panel on `prompt` whose side A is `current` (what the chat runs) and side B the
    /// first other choice the file offers.
    pub fn new(prompt: String, choices: &Choices, current: &Request) -> CompareState {
        let a = (
            choices.task_row(current.task.as_deref()),
            choices.skill_row(&current.skill),
        );
        let b = if a.1 == 0 && !choices.skills.is_empty() {
            (a.0, 1)
        } else if a.1 != 0 {
            (a.0, 0)
        } else if a.0 == 0 && !choices.tasks.is_empty() {
            (1, a.1)
        } else {
            (0, a.1)
        };
        CompareState {
            row: 0,
            sel: [a, b],
            prompt,
            run: 0,
            running: false,
            sides: Default::default(),
        }
    }

    /// ←/→ on the selected row: the next or previous option, wrapping.
    pub fn nudge(&mut self, choices: &Choices, up: bool) {
        let (side, skill) = (self.row / 2, self.row % 2 == 1);
        let n = if skill {
            choices.skill_rows()
        } else {
            choices.task_rows()
        };
        let v = if skill {
            &mut self.sel[side].1
        } else {
            &mut self.sel[side].0
        };
        *v = if up { (*v + 1) % n } else { (*v + n - 1) % n };
    }

    /// The request of side `side`.
    pub fn request(&self, choices: &Choices, side: usize) -> Request {
        let (t, s) = self.sel[side];
        Request {
            task: choices.task_at(t),
            skill: choices.skill_at(s, BLEND_T),
        }
    }

    /// The value shown on setting row `row`.
    pub fn value(&self, choices: &Choices, row: usize) -> String {
        let (t, s) = self.sel[row / 2];
        if row % 2 == 1 {
            choices.skill_label(s, BLEND_T).0
        } else {
            choices.task_label(t).0
        }
    }

    /// Applies a report of the current run.
    pub fn on_report(&mut self, r: &CompareReport) {
        if r.run != self.run || r.side > 1 {
            return;
        }
        let side = &mut self.sides[r.side];
        match &r.step {
            CompareStep::Started { label, .. } => side.label = Some(label.clone()),
            CompareStep::Token { id, text } => {
                side.ids.push(*id);
                side.texts.push(text.clone());
            }
            CompareStep::Done { stop } => side.stop = Some(*stop),
            CompareStep::Failed(e) => side.error = Some(e.clone()),
        }
        if self.sides.iter().all(CompareSide::finished) {
            self.running = false;
        }
    }

    /// Where the answers part, as far as they have come.
    pub fn divergence(&self) -> Divergence {
        let [a, b] = &self.sides;
        if let Some(i) = a.ids.iter().zip(&b.ids).position(|(x, y)| x != y) {
            return Divergence::At(i);
        }
        let n = a.ids.len().min(b.ids.len());
        let done = |s: &CompareSide| s.stop.is_some() && s.error.is_none();
        match (done(a), done(b)) {
            (true, true) if a.ids.len() == b.ids.len() => Divergence::Same(n),
            (true, true) => Divergence::At(n),
            // One ended, the other went past it.
            (true, false) if b.ids.len() > n => Divergence::At(n),
            (false, true) if a.ids.len() > n => Divergence::At(n),
            _ => Divergence::Pending,
        }
    }

    /// One line on the answers: where they part, or that they agree.
    pub fn summary(&self) -> String {
        let quote = |s: &CompareSide, i: usize| match s.texts.get(i) {
            Some(t) => format!("“{}” (id {})", esc_piece(t), s.ids[i]),
            None => "the end".into(),
        };
        if self.sides.iter().any(|s| s.error.is_some()) {
            return "a side failed: see its panel".into();
        }
        match self.divergence() {
            Divergence::At(i) => format!(
                "the answers part at token {}: A {} · B {}",
                i + 1,
                quote(&self.sides[0], i),
                quote(&self.sides[1], i)
            ),
            Divergence::Same(n) => format!("the same {n} tokens under both choices"),
            Divergence::Pending if self.running => "answering…".into(),
            Divergence::Pending if self.run == 0 => {
                "Enter answers the prompt under A, then under B".into()
            }
            Divergence::Pending => "stopped".into(),
        }
    }
}

fn esc_piece(s: &str) -> String {
    cortiq_views::util::esc(&s.replace('\n', "↵"))
}

/// What a compare job needs.
#[derive(Clone, Debug)]
pub struct CompareJob {
    pub run: u64,
    pub engine: SharedEngine,
    pub requests: [Request; 2],
    pub prompt: String,
    /// The chat's settings (system prompt, variables, max tokens); sampling is greedy.
    pub settings: Settings,
}

/// Runs both sides, reporting each step; stops early when `cancel` is raised.
pub fn run(job: &CompareJob, cancel: &AtomicBool, report: &dyn Fn(JobReport)) {
    for side in 0..2 {
        let send = |step: CompareStep| {
            report(JobReport::Compare(CompareReport {
                run: job.run,
                side,
                step,
            }))
        };
        if let Err(e) = run_side(job, &job.requests[side], cancel, &send) {
            send(CompareStep::Failed(e));
        }
    }
}

fn run_side(
    job: &CompareJob,
    req: &Request,
    cancel: &AtomicBool,
    send: &dyn Fn(CompareStep),
) -> Result<(), String> {
    let cancelled = || cancel.load(Ordering::Relaxed);
    // A streaming chat answer has the cores.
    yield_to_foreground(&cancelled);
    let model = &job.engine.model;
    let raw = job.engine.raw_tokens(&job.prompt);
    let r = resolve(model, req, &raw).map_err(|e| e.to_string())?;
    let mut settings = job.settings.clone();
    settings.sampling = SamplingParams::greedy();
    // Room for the prompt in its template and the answer, not the chat's whole context.
    let system = settings.system.as_deref().map_or(0, str::len);
    let want = (raw.len() + system) * 2 + 128 + settings.max_tokens;
    let context = want
        .min(CHAT_CONTEXT)
        .min(model.config.max_positions)
        .max(1);
    let mut conv = Conversation::new(model.clone(), job.engine.bundle.clone(), context, settings)
        .map_err(|e| e.to_string())?;
    // A fresh session: nothing is cached, the switch only sets the choice.
    conv.switch(r.active, SwitchPolicy::Reprefill)
        .map_err(|e| e.to_string())?;
    send(CompareStep::Started {
        label: conv.session().active_label().to_string(),
        warnings: r.warnings,
    });
    conv.push_user(job.prompt.clone());
    let mut reply = conv.reply().map_err(|e| e.to_string())?;
    loop {
        yield_to_foreground(&cancelled);
        if cancelled() {
            reply.cancel();
        }
        match reply.next().map_err(|e| e.to_string())? {
            ReplyStep::Prefill { .. } => {}
            ReplyStep::Token { token, piece } => send(CompareStep::Token {
                id: token.id,
                text: piece.unwrap_or_default(),
            }),
            ReplyStep::Done(stats) => {
                send(CompareStep::Done { stop: stats.stop });
                return Ok(());
            }
        }
    }
}

/// The label a side shows before its session starts: what was asked.
pub fn asked(choices: &Choices, c: &CompareState, side: usize) -> String {
    request_text(&c.request(choices, side))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn side(ids: &[u32], stop: Option<StopReason>) -> CompareSide {
        CompareSide {
            label: None,
            ids: ids.to_vec(),
            texts: ids.iter().map(|i| format!("t{i}")).collect(),
            stop,
            error: None,
        }
    }

    fn state(a: CompareSide, b: CompareSide) -> CompareState {
        CompareState {
            row: 0,
            sel: [(0, 0), (0, 1)],
            prompt: "p".into(),
            run: 1,
            running: true,
            sides: [a, b],
        }
    }

    #[test]
    fn divergence_is_the_first_differing_token_or_an_early_end() {
        let eos = Some(StopReason::Eos);
        assert_eq!(
            state(side(&[1, 2, 3], None), side(&[1, 5], None)).divergence(),
            Divergence::At(1)
        );
        assert_eq!(
            state(side(&[1, 2], None), side(&[1, 2], None)).divergence(),
            Divergence::Pending
        );
        assert_eq!(
            state(side(&[1, 2], eos), side(&[1, 2], eos)).divergence(),
            Divergence::Same(2)
        );
        assert_eq!(
            state(side(&[1, 2], eos), side(&[1, 2, 9], None)).divergence(),
            Divergence::At(2)
        );
        let s = state(side(&[1, 2], eos), side(&[1, 3], eos));
        assert!(s
            .summary()
            .contains("token 2: A “t2” (id 2) · B “t3” (id 3)"));
    }

    #[test]
    fn reports_of_another_run_are_dropped() {
        let mut s = state(side(&[], None), side(&[], None));
        s.on_report(&CompareReport {
            run: 7,
            side: 0,
            step: CompareStep::Token {
                id: 3,
                text: "x".into(),
            },
        });
        assert!(s.sides[0].ids.is_empty());
        s.on_report(&CompareReport {
            run: 1,
            side: 5,
            step: CompareStep::Failed("x".into()),
        });
        for side in 0..2 {
            s.on_report(&CompareReport {
                run: 1,
                side,
                step: CompareStep::Done {
                    stop: StopReason::Eos,
                },
            });
        }
        assert!(!s.running);
        assert_eq!(s.divergence(), Divergence::Same(0));
    }
}
