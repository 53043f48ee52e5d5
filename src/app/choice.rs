//! What a file offers to run under — its task masks (§5) and skills (§9), plus `none`,
//! `auto` routing and a soft blend — as the chat's pickers and compare mode list them,
//! and the words the views use for a choice, a switch and the cache policy. Names come
//! from the file: everything shown goes through `esc`.

use cortiq_engine::format::CmfFile;
use cortiq_engine::runtime::choice::{Request, SkillRequest};
use cortiq_engine::runtime::session::{SwitchPolicy, SwitchReport};
use cortiq_views::util::esc;

/// One task of the masks section.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskOption {
    pub name: String,
    /// Its quality contract is measured (not JSON null).
    pub measured: bool,
    pub experts: bool,
}

/// One skill of the registry.
#[derive(Clone, Debug, PartialEq)]
pub struct SkillOption {
    pub id: String,
    /// It has a routing subspace (`auto` and blends can score it).
    pub routable: bool,
}

/// The blend temperature a picker starts at (as `blend` on the command line).
pub const BLEND_T: f32 = 0.5;

/// The file's tasks and skills, in file order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Choices {
    pub tasks: Vec<TaskOption>,
    pub skills: Vec<SkillOption>,
}

impl Choices {
    pub fn of(file: &CmfFile) -> Choices {
        let tasks = file
            .masks
            .as_ref()
            .map(|m| {
                m.meta
                    .masks
                    .iter()
                    .map(|r| TaskOption {
                        name: r.name.clone(),
                        measured: r.quality.as_ref().is_some_and(|q| !q.is_null()),
                        experts: r.has_expert_fields,
                    })
                    .collect()
            })
            .unwrap_or_default();
        let skills = file
            .header
            .skills
            .as_deref()
            .unwrap_or_default()
            .iter()
            .map(|s| SkillOption {
                id: s.id.clone(),
                routable: s.selection.is_some(),
            })
            .collect();
        Choices { tasks, skills }
    }

    /// Rows of the task picker: `none`, then every task.
    pub fn task_rows(&self) -> usize {
        self.tasks.len() + 1
    }

    /// The task of picker row `row` (`None`: no mask).
    pub fn task_at(&self, row: usize) -> Option<String> {
        row.checked_sub(1)
            .and_then(|i| self.tasks.get(i))
            .map(|t| t.name.clone())
    }

    /// The picker row of `task`.
    pub fn task_row(&self, task: Option<&str>) -> usize {
        task.and_then(|t| self.tasks.iter().position(|o| o.name == t))
            .map_or(0, |i| i + 1)
    }

    /// Rows of the skill picker: `none`, every skill, `auto`, `blend`.
    pub fn skill_rows(&self) -> usize {
        self.skills.len() + 3
    }

    /// The skill request of picker row `row` (a blend at `temperature`).
    pub fn skill_at(&self, row: usize, temperature: f32) -> SkillRequest {
        let n = self.skills.len();
        match row {
            0 => SkillRequest::None,
            r if r <= n => SkillRequest::Id(self.skills[r - 1].id.clone()),
            r if r == n + 1 => SkillRequest::Auto,
            _ => SkillRequest::Blend { temperature },
        }
    }

    /// The picker row of `skill`.
    pub fn skill_row(&self, skill: &SkillRequest) -> usize {
        let n = self.skills.len();
        match skill {
            SkillRequest::None => 0,
            SkillRequest::Id(id) => self
                .skills
                .iter()
                .position(|s| &s.id == id)
                .map_or(0, |i| i + 1),
            SkillRequest::Auto => n + 1,
            SkillRequest::Blend { .. } => n + 2,
        }
    }

    /// Picker row `row` of the task picker as shown, and its note.
    pub fn task_label(&self, row: usize) -> (String, String) {
        match row.checked_sub(1).and_then(|i| self.tasks.get(i)) {
            None => ("none".into(), "every neuron, head, layer and expert".into()),
            Some(t) => {
                let mut note = Vec::new();
                if t.experts {
                    note.push("expert fields");
                }
                if !t.measured {
                    note.push("quality not measured");
                }
                (esc(&t.name), note.join(" · "))
            }
        }
    }

    /// Picker row `row` of the skill picker as shown, and its note.
    pub fn skill_label(&self, row: usize, temperature: f32) -> (String, String) {
        let n = self.skills.len();
        match row {
            0 => ("none".into(), "the backbone's tensors".into()),
            r if r <= n => {
                let s = &self.skills[r - 1];
                (
                    esc(&s.id),
                    if s.routable {
                        String::new()
                    } else {
                        "no routing subspace".into()
                    },
                )
            }
            r if r == n + 1 => (
                "auto".into(),
                "the least routing error E, chosen on each message".into(),
            ),
            _ => (
                "blend".into(),
                format!("softmax(−E/T) mix on each message · T {temperature:.2} (←/→)"),
            ),
        }
    }
}

/// `task code + skill auto`, `skill blend T 0.50`, `backbone`: a request as asked.
pub fn request_text(r: &Request) -> String {
    let task = r.task.as_ref().map(|t| format!("task {}", esc(t)));
    let skill = skill_text(&r.skill);
    match (task, skill) {
        (None, None) => "backbone".into(),
        (Some(t), None) => t,
        (None, Some(s)) => s,
        (Some(t), Some(s)) => format!("{t} + {s}"),
    }
}

fn skill_text(s: &SkillRequest) -> Option<String> {
    match s {
        SkillRequest::None => None,
        SkillRequest::Id(id) => Some(format!("skill {}", esc(id))),
        SkillRequest::Auto => Some("skill auto".into()),
        SkillRequest::Blend { temperature } => Some(format!("skill blend T {temperature:.2}")),
    }
}

/// What a switch does to the cache, in a few words.
pub fn policy_text(p: SwitchPolicy) -> &'static str {
    match p {
        SwitchPolicy::KeepCache => "keep the cache (fast, approximate)",
        SwitchPolicy::Reprefill => "re-prefill (exact)",
    }
}

/// The other policy.
pub fn other_policy(p: SwitchPolicy) -> SwitchPolicy {
    match p {
        SwitchPolicy::KeepCache => SwitchPolicy::Reprefill,
        SwitchPolicy::Reprefill => SwitchPolicy::KeepCache,
    }
}

/// The transcript's divider for a switch: the new choice and what became of the cache.
pub fn divider_text(r: &SwitchReport) -> String {
    let how = match r.policy {
        SwitchPolicy::KeepCache if r.kept == 0 => "cache kept (nothing cached yet)".to_string(),
        SwitchPolicy::KeepCache => format!(
            "cache kept: {} positions computed under {}",
            r.kept,
            esc(&r.from)
        ),
        SwitchPolicy::Reprefill if r.recomputed == 0 => {
            "re-prefill: nothing cached to recompute".to_string()
        }
        SwitchPolicy::Reprefill => format!(
            "re-prefilled {} positions in {:.2} s",
            r.recomputed, r.elapsed_s
        ),
    };
    format!("{} · {how}", esc(&r.to))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn choices() -> Choices {
        Choices {
            tasks: vec![TaskOption {
                name: "co\u{1b}de".into(),
                measured: false,
                experts: true,
            }],
            skills: vec![SkillOption {
                id: "sql".into(),
                routable: true,
            }],
        }
    }

    #[test]
    fn rows_map_to_requests_and_back() {
        let c = choices();
        assert_eq!(c.task_rows(), 2);
        assert_eq!(c.task_at(0), None);
        assert_eq!(c.task_at(1).as_deref(), Some("co\u{1b}de"));
        assert_eq!(c.task_at(7), None);
        assert_eq!(c.task_row(Some("co\u{1b}de")), 1);
        assert_eq!(c.task_row(Some("nope")), 0);
        assert_eq!(c.skill_rows(), 4);
        for row in 0..4 {
            assert_eq!(c.skill_row(&c.skill_at(row, 0.3)), row);
        }
        assert_eq!(c.skill_at(3, 0.3), SkillRequest::Blend { temperature: 0.3 });
        assert_eq!(
            c.skill_at(99, 0.3),
            SkillRequest::Blend { temperature: 0.3 }
        );
    }

    #[test]
    fn names_are_escaped() {
        let c = choices();
        let (label, note) = c.task_label(1);
        assert!(!label.contains('\u{1b}'), "{label}");
        assert!(note.contains("not measured"), "{note}");
        let r = Request {
            task: Some("a\nb".into()),
            skill: SkillRequest::Auto,
        };
        assert_eq!(request_text(&r), "task a\\nb + skill auto");
        let s = SwitchReport {
            from: "back\u{7}bone".into(),
            to: "task x".into(),
            policy: SwitchPolicy::KeepCache,
            kept: 12,
            recomputed: 0,
            elapsed_s: 0.0,
        };
        assert_eq!(
            divider_text(&s),
            "task x · cache kept: 12 positions computed under back\\u{7}bone"
        );
    }
}
