//! What the user asks to run under — a task by name, a skill by id, `auto` routing or a
//! soft blend — resolved against a model into the [`Active`] choice a session runs. The
//! command line (`run --task/--skill`) and the workbench's pickers both go through
//! [`resolve`], so they accept and refuse the same things.

use std::sync::Arc;

use super::skill_route::{self, Routing};
use crate::model::select::{build_blend, Active, SkillChoice};
use crate::model::{Model, ModelError};

/// The skill part of a request.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SkillRequest {
    /// The backbone.
    #[default]
    None,
    /// A skill by id.
    Id(String),
    /// Recon-argmin routing (§9) on the prompt.
    Auto,
    /// A soft mix `Σ wᵢ·Tᵢ`, `wᵢ = softmax(−Eᵢ/T)` of the prompt's routing errors.
    Blend { temperature: f32 },
}

impl SkillRequest {
    /// `none`, `auto`, `blend`, `blend:T` or a skill id.
    pub fn parse(s: &str) -> Result<SkillRequest, String> {
        Ok(match s {
            "none" | "" => SkillRequest::None,
            "auto" => SkillRequest::Auto,
            "blend" => SkillRequest::Blend { temperature: 0.5 },
            _ => match s.strip_prefix("blend:") {
                Some(t) => {
                    let temperature: f32 = t
                        .parse()
                        .map_err(|_| format!("blend temperature {t:?} is not a number"))?;
                    if !(temperature.is_finite() && temperature > 0.0) {
                        return Err(format!("blend temperature {t} must be positive"));
                    }
                    SkillRequest::Blend { temperature }
                }
                None => SkillRequest::Id(s.to_string()),
            },
        })
    }

    /// Whether the choice depends on the prompt.
    pub fn needs_prompt(&self) -> bool {
        matches!(self, SkillRequest::Auto | SkillRequest::Blend { .. })
    }
}

/// A task and a skill, as asked for.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Request {
    pub task: Option<String>,
    pub skill: SkillRequest,
}

/// A request resolved against a model.
#[derive(Clone, Debug)]
pub struct Resolved {
    pub active: Active,
    /// The routing scores, for `auto` and blends.
    pub routing: Option<Routing>,
    /// What the user should know (an unmeasured task, a blend's memory).
    pub warnings: Vec<String>,
    /// Bytes of weights a blend materialised (0 otherwise).
    pub blend_bytes: usize,
}

/// Resolves `req` for `model`; `prompt` (raw tokens of what the user asks) is routed
/// for `auto` and blends.
pub fn resolve(model: &Model, req: &Request, prompt: &[u32]) -> Result<Resolved, ModelError> {
    let mut warnings = Vec::new();
    let mut routing = None;
    let mut blend_bytes = 0;
    let usable = |k: u16| -> Result<u16, ModelError> {
        let info = &model.skills[k as usize];
        match &info.problem {
            Some(p) => Err(ModelError::Unsupported(format!("skill {}: {p}", info.id))),
            None => Ok(k),
        }
    };
    let skill = match &req.skill {
        SkillRequest::None => SkillChoice::None,
        SkillRequest::Id(id) => {
            let k = model.skill_index(id).ok_or_else(|| {
                let ids: Vec<&str> = model.skills.iter().map(|s| s.id.as_str()).collect();
                ModelError::UnknownChoice(if ids.is_empty() {
                    format!("no skill {id:?}: the file has no skills")
                } else {
                    format!("no skill {id:?}; the file's skills: {}", ids.join(", "))
                })
            })?;
            SkillChoice::One(usable(k)?)
        }
        SkillRequest::Auto => {
            let r = skill_route::route(model, prompt)?;
            let choice = r.choice;
            routing = Some(r);
            match choice {
                Some(k) => SkillChoice::One(usable(k)?),
                None => {
                    warnings.push(
                        "skill auto: no skill has a usable routing subspace; running the \
                         backbone"
                            .into(),
                    );
                    SkillChoice::None
                }
            }
        }
        SkillRequest::Blend { temperature } => {
            if let Some(bad) = model.skills.iter().find(|s| s.problem.is_some()) {
                return Err(ModelError::Unsupported(format!(
                    "skill {}: {}",
                    bad.id,
                    bad.problem.as_deref().unwrap_or_default()
                )));
            }
            let r = skill_route::route(model, prompt)?;
            let weights = r.blend(*temperature);
            routing = Some(r);
            if weights.iter().all(|&w| w == 0.0) {
                warnings.push("skill blend: no skill has a usable routing subspace".into());
                SkillChoice::None
            } else {
                let blend = build_blend(model, &weights);
                blend_bytes = blend.bytes();
                SkillChoice::Blend {
                    weights,
                    blend: Arc::new(blend),
                }
            }
        }
    };
    // A skill may name the task mask its inputs run under (`input_mask_task`).
    let skill_task = match &skill {
        SkillChoice::One(k) => model
            .file
            .header()
            .skills
            .as_ref()
            .and_then(|s| s.get(*k as usize))
            .and_then(|r| r.input_mask_task.clone()),
        _ => None,
    };
    let task_name = req.task.clone().or(skill_task);
    let task = match &task_name {
        None => None,
        Some(name) => {
            let t = model.task(name)?;
            if !t.measured {
                warnings.push(format!(
                    "task {name}: its quality is not measured (quality: null in the file)"
                ));
            }
            Some(t)
        }
    };
    Ok(Resolved {
        active: Active { task, skill },
        routing,
        warnings,
        blend_bytes,
    })
}
