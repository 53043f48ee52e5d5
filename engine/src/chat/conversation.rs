//! A conversation with a model: the messages, the chat bundle that renders them, the
//! session that runs them, and streaming detokenisation of each reply. The one service
//! that both `cortiq run` and the workbench's chat view drive.
//!
//! A reply is stepped ([`Reply::next`]) by its owner, one prefill chunk or one token per
//! call, so a UI can cancel, repaint or switch settings between tokens. Each turn renders
//! the whole conversation again; the session reuses the cached prefix, so only the new part
//! is computed.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::template::RenderOptions;
use super::tokenizer::TextStream;
use super::{ChatBundle, ChatError};
use crate::model::select::Active;
use crate::model::{Model, ModelError, Precision};
use crate::runtime::sampler::SamplingParams;
use crate::runtime::session::{
    GenerateParams, Generation, GenerationStats, Session, Step, StopReason, SwitchPolicy,
    SwitchReport, TokenStep,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    User,
    Assistant,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

/// One turn. Assistant turns keep the ids they were generated as, and why they ended.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    pub content: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ids: Vec<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<StopReason>,
    /// The task mask and skill an answer was generated under (its label), when not the
    /// backbone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub choice: Option<String>,
}

impl Message {
    pub fn user(text: impl Into<String>) -> Message {
        Message {
            role: Role::User,
            content: text.into(),
            ids: Vec::new(),
            stop: None,
            choice: None,
        }
    }
}

/// A switch of task mask or skill in the transcript: before message `before`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SwitchMark {
    pub before: usize,
    pub report: SwitchReport,
}

/// Why a turn could not start or went wrong.
#[derive(Debug, thiserror::Error)]
pub enum ConversationError {
    /// Rendering or tokenizing the conversation failed (the template refused it, a
    /// template limit was hit, the file has no tokenizer).
    #[error(transparent)]
    Chat(#[from] ChatError),
    /// The engine failed; `partial` holds the ids generated before the failure.
    #[error("{error}")]
    Model {
        error: ModelError,
        partial: Vec<u32>,
    },
    /// The rendered conversation does not fit the session's context.
    #[error("the conversation ({needed} tokens) fills the context of {capacity}: reset it to start over")]
    ContextFull { needed: usize, capacity: usize },
    /// The operation needs a user message last (a reply), or an assistant one
    /// (regenerate), or any user message (edit).
    #[error("{0}")]
    State(&'static str),
}

/// The conversation's settings besides its messages.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    pub system: Option<String>,
    /// Template variables (`enable_thinking`, ...).
    pub vars: Map<String, Value>,
    pub sampling: SamplingParams,
    pub max_tokens: usize,
    /// Keep generating past the stop ids.
    pub ignore_eos: bool,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            system: None,
            vars: Map::new(),
            sampling: SamplingParams {
                temperature: 0.8,
                top_k: 40,
                top_p: 0.95,
                min_p: 0.05,
                repetition_penalty: 1.0,
                seed: 0,
            },
            max_tokens: 512,
            ignore_eos: false,
        }
    }
}

pub struct Conversation {
    bundle: Arc<ChatBundle>,
    session: Session,
    pub settings: Settings,
    messages: Vec<Message>,
    switches: Vec<SwitchMark>,
}

/// What one [`Reply::next`] did.
#[derive(Clone, Debug, PartialEq)]
pub enum ReplyStep {
    Prefill {
        done: usize,
        total: usize,
    },
    /// A token, and the text it completed (none while a character is incomplete, or for a
    /// special token).
    Token {
        token: TokenStep,
        piece: Option<String>,
    },
    /// The reply is over and recorded as the last message.
    Done(GenerationStats),
}

impl Conversation {
    /// A conversation over `model` with `context` positions. Needs a tokenizer.
    pub fn new(
        model: Arc<Model>,
        bundle: Arc<ChatBundle>,
        context: usize,
        settings: Settings,
    ) -> Result<Conversation, ConversationError> {
        if bundle.tokenizer().is_none() {
            return Err(ChatError::NoTokenizer.into());
        }
        Ok(Conversation {
            session: Session::new(model, context),
            bundle,
            settings,
            messages: Vec::new(),
            switches: Vec::new(),
        })
    }

    /// Switches task mask and skill between turns (see [`Session::switch`]); the switch
    /// is marked in the transcript before the next message.
    pub fn switch(
        &mut self,
        active: Active,
        policy: SwitchPolicy,
    ) -> Result<SwitchReport, ConversationError> {
        let report =
            self.session
                .switch(active, policy)
                .map_err(|error| ConversationError::Model {
                    error,
                    partial: Vec::new(),
                })?;
        self.switches.push(SwitchMark {
            before: self.messages.len(),
            report: report.clone(),
        });
        Ok(report)
    }

    /// Every switch so far, in order.
    pub fn switches(&self) -> &[SwitchMark] {
        &self.switches
    }

    pub fn bundle(&self) -> &ChatBundle {
        &self.bundle
    }

    /// The bundle as a shared handle (to decode while a [`Reply`] borrows the
    /// conversation).
    pub fn bundle_arc(&self) -> &Arc<ChatBundle> {
        &self.bundle
    }

    pub fn session(&self) -> &Session {
        &self.session
    }

    /// Keeps every position's expert choices from now on (MoE models): see
    /// [`Session::log_routes`] and [`Session::routes`]. The state restarts empty.
    pub fn log_routes(&mut self) {
        self.session.log_routes();
    }

    /// Speculative decoding with the model's MTP head (see
    /// [`Session::set_speculative`]); the state restarts empty.
    pub fn set_speculative(&mut self, on: bool) -> Result<(), String> {
        self.session.set_speculative(on)
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.session.model
    }

    pub fn messages(&self) -> &[Message] {
        &self.messages
    }

    /// Replaces the messages (a loaded session); the cache keeps whatever prefix matches.
    pub fn set_messages(&mut self, messages: Vec<Message>) {
        self.messages = messages;
    }

    /// Forgets the messages (the system prompt stays) and empties the cache.
    pub fn reset(&mut self) {
        self.messages.clear();
        self.switches.clear();
        self.session.reset();
    }

    pub fn push_user(&mut self, text: impl Into<String>) {
        self.messages.push(Message::user(text));
    }

    /// The messages as a chat template takes them, the system prompt first.
    pub fn template_messages(&self) -> Value {
        let mut v = Vec::with_capacity(self.messages.len() + 1);
        if let Some(s) = self.settings.system.as_deref().filter(|s| !s.is_empty()) {
            v.push(json!({"role": "system", "content": s}));
        }
        for m in &self.messages {
            v.push(json!({"role": m.role.as_str(), "content": m.content}));
        }
        Value::Array(v)
    }

    /// The exact prompt text of the conversation as it stands, ending with the opening
    /// of an assistant turn.
    pub fn prompt_text(&self) -> Result<String, ChatError> {
        let opts = RenderOptions {
            add_generation_prompt: true,
            extra: self.settings.vars.clone(),
            ..Default::default()
        };
        self.bundle.render_chat(&self.template_messages(), &opts)
    }

    /// The prompt's token ids.
    pub fn prompt_ids(&self) -> Result<Vec<u32>, ChatError> {
        self.bundle.encode_prompt(&self.prompt_text()?)
    }

    /// Starts the assistant's answer to the last (user) message.
    pub fn reply(&mut self) -> Result<Reply<'_>, ConversationError> {
        if self.messages.last().map(|m| m.role) != Some(Role::User) {
            return Err(ConversationError::State(
                "a reply needs a user message last",
            ));
        }
        let prompt = self.prompt_ids()?;
        self.reply_to(&prompt)
    }

    /// Drops the last answer and answers its question again.
    pub fn regenerate(&mut self) -> Result<Reply<'_>, ConversationError> {
        if self.messages.last().map(|m| m.role) != Some(Role::Assistant) {
            return Err(ConversationError::State("no answer to regenerate"));
        }
        self.messages.pop();
        self.reply()
    }

    /// Replaces the last user message by `text`, forgetting everything after it; the
    /// caller then asks for a [`Conversation::reply`].
    pub fn edit_last_user(&mut self, text: impl Into<String>) -> Result<(), ConversationError> {
        let i = self
            .messages
            .iter()
            .rposition(|m| m.role == Role::User)
            .ok_or(ConversationError::State("no user message to edit"))?;
        self.messages.truncate(i);
        self.push_user(text);
        Ok(())
    }

    /// The last user message's text.
    pub fn last_user(&self) -> Option<&str> {
        self.messages
            .iter()
            .rev()
            .find(|m| m.role == Role::User)
            .map(|m| m.content.as_str())
    }

    fn reply_to(&mut self, prompt: &[u32]) -> Result<Reply<'_>, ConversationError> {
        let capacity = self.session.capacity();
        if prompt.len() >= capacity {
            return Err(ConversationError::ContextFull {
                needed: prompt.len(),
                capacity,
            });
        }
        let params = GenerateParams {
            max_tokens: self.settings.max_tokens.max(1),
            sampling: self.settings.sampling.clone(),
            stop_ids: if self.settings.ignore_eos {
                Vec::new()
            } else {
                self.bundle.eos_token_ids().to_vec()
            },
        };
        let tokenizer = self.bundle.tokenizer().ok_or(ChatError::NoTokenizer)?;
        let choice = Some(self.session.active_label().to_string()).filter(|l| l != "backbone");
        let generation =
            self.session
                .start(prompt, &params)
                .map_err(|error| ConversationError::Model {
                    error,
                    partial: Vec::new(),
                })?;
        Ok(Reply {
            generation,
            stream: tokenizer.stream(true),
            text: String::new(),
            messages: &mut self.messages,
            recorded: false,
            choice,
        })
    }
}

/// An answer being generated. Dropping it before it is done records what was generated
/// as a stopped answer, so the conversation never loses a partial reply.
pub struct Reply<'c> {
    generation: Generation<'c>,
    stream: TextStream<'c>,
    text: String,
    messages: &'c mut Vec<Message>,
    recorded: bool,
    choice: Option<String>,
}

impl Reply<'_> {
    /// One prefill chunk or one token.
    // Not an Iterator: every call says what happened (Done included) or why it failed.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Result<ReplyStep, ConversationError> {
        match self.generation.next() {
            Ok(Step::Prefill { done, total }) => Ok(ReplyStep::Prefill { done, total }),
            Ok(Step::Token(token)) => {
                let piece = self.stream.step(token.id)?;
                if let Some(p) = &piece {
                    self.text.push_str(p);
                }
                Ok(ReplyStep::Token { token, piece })
            }
            Ok(Step::Done(stats)) => {
                self.record(stats.stop)?;
                Ok(ReplyStep::Done(stats))
            }
            Err(e) => {
                let _ = self.record(StopReason::Error);
                Err(ConversationError::Model {
                    error: e.error,
                    partial: e.partial,
                })
            }
        }
    }

    /// Stops the answer; the next [`Reply::next`] records it as cancelled and says `Done`.
    pub fn cancel(&mut self) {
        self.generation.cancel();
    }

    /// Sampling from the next token on.
    pub fn set_sampling(&mut self, sampling: SamplingParams) {
        self.generation.set_sampling(sampling);
    }

    /// The text so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    pub fn ids(&self) -> &[u32] {
        self.generation.output()
    }

    /// The session being stepped (its tokens and route log between steps).
    pub fn session(&self) -> &Session {
        self.generation.session()
    }

    pub fn stats(&self) -> GenerationStats {
        self.generation.stats()
    }

    /// Runs to the end, calling `on_step` for every step; returns the final stats.
    pub fn run(
        mut self,
        on_step: &mut dyn FnMut(&ReplyStep),
    ) -> Result<(String, Vec<u32>, GenerationStats), ConversationError> {
        loop {
            let step = self.next()?;
            on_step(&step);
            if let ReplyStep::Done(stats) = step {
                let ids = self.generation.output().to_vec();
                return Ok((std::mem::take(&mut self.text), ids, stats));
            }
        }
    }

    fn record(&mut self, stop: StopReason) -> Result<(), ChatError> {
        if self.recorded {
            return Ok(());
        }
        self.recorded = true;
        let rest = self.stream.finish();
        if let Ok(Some(r)) = &rest {
            self.text.push_str(r);
        }
        self.messages.push(Message {
            role: Role::Assistant,
            content: self.text.clone(),
            ids: self.generation.output().to_vec(),
            stop: Some(stop),
            choice: self.choice.clone(),
        });
        rest.map(|_| ())
    }
}

impl Drop for Reply<'_> {
    fn drop(&mut self) {
        if !self.recorded {
            let _ = self.record(StopReason::Cancelled);
        }
    }
}

/// A conversation saved to JSON: enough to reload it and to replay it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SavedSession {
    /// `"cortiq-session"`.
    pub format: String,
    pub version: u32,
    pub model: SavedModel,
    #[serde(default)]
    pub system: Option<String>,
    #[serde(default)]
    pub vars: Map<String, Value>,
    pub sampling: SavedSampling,
    pub precision: String,
    pub messages: Vec<Message>,
}

/// Which model a session ran on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SavedModel {
    pub path: String,
    /// hash64 of the primary file's directory, 16 hex digits (it covers every tensor's
    /// hash: the model's identity).
    pub directory_hash: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SavedSampling {
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub min_p: f32,
    pub repeat_penalty: f32,
    pub seed: u64,
    pub max_tokens: usize,
    pub greedy: bool,
}

pub const SESSION_FORMAT: &str = "cortiq-session";
pub const SESSION_VERSION: u32 = 1;

fn precision_name(p: Precision) -> &'static str {
    p.name()
}

/// `"balanced"`, `"exact"` or `"fast"`.
pub fn parse_precision(s: &str) -> Option<Precision> {
    Precision::parse(s)
}

impl SavedSession {
    /// The session's form of a conversation.
    pub fn of(conv: &Conversation, model_path: &str, precision: Precision) -> SavedSession {
        let s = &conv.settings;
        let file = conv.session.model.file.primary();
        SavedSession {
            format: SESSION_FORMAT.into(),
            version: SESSION_VERSION,
            model: SavedModel {
                path: model_path.into(),
                directory_hash: format!("{:016x}", file.directory_hash()),
            },
            system: s.system.clone(),
            vars: s.vars.clone(),
            sampling: SavedSampling {
                temperature: s.sampling.temperature,
                top_k: s.sampling.top_k,
                top_p: s.sampling.top_p,
                min_p: s.sampling.min_p,
                repeat_penalty: s.sampling.repetition_penalty,
                seed: s.sampling.seed,
                max_tokens: s.max_tokens,
                greedy: s.sampling.is_greedy(),
            },
            precision: precision_name(precision).into(),
            messages: conv.messages.clone(),
        }
    }

    /// Parses and checks a saved session.
    pub fn from_json(text: &str) -> Result<SavedSession, String> {
        let s: SavedSession =
            serde_json::from_str(text).map_err(|e| format!("not a saved session: {e}"))?;
        if s.format != SESSION_FORMAT {
            return Err(format!(
                "not a saved session: format {:?}, expected {SESSION_FORMAT:?}",
                s.format
            ));
        }
        if s.version != SESSION_VERSION {
            return Err(format!(
                "saved session version {} is not supported (this build reads {SESSION_VERSION})",
                s.version
            ));
        }
        if parse_precision(&s.precision).is_none() {
            return Err(format!(
                "saved session: precision {:?} is not exact or fast",
                s.precision
            ));
        }
        s.settings().sampling.validate()?;
        Ok(s)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// The settings it records.
    pub fn settings(&self) -> Settings {
        let p = &self.sampling;
        Settings {
            system: self.system.clone(),
            vars: self.vars.clone(),
            sampling: SamplingParams {
                temperature: if p.greedy { 0.0 } else { p.temperature },
                top_k: p.top_k,
                top_p: p.top_p,
                min_p: p.min_p,
                repetition_penalty: p.repeat_penalty,
                seed: p.seed,
            },
            max_tokens: p.max_tokens.max(1),
            ignore_eos: false,
        }
    }

    /// Whether it was saved from the model whose directory hashes to `hash`.
    pub fn matches_model(&self, directory_hash: u64) -> bool {
        self.model.directory_hash == format!("{directory_hash:016x}")
    }
}

/// One assistant turn of a replay: the ids saved and the ids generated again.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplayTurn {
    pub turn: usize,
    pub saved: Vec<u32>,
    pub replayed: Vec<u32>,
}

impl ReplayTurn {
    pub fn same(&self) -> bool {
        self.saved == self.replayed
    }
}

impl Conversation {
    /// Prepares the replay of the assistant turn at message index `i` of `saved`: the
    /// conversation holds the messages before it; the caller then steps
    /// [`Conversation::reply`] and compares with `saved.messages[i].ids`.
    pub fn rewind_to(&mut self, saved: &SavedSession, i: usize) {
        self.messages = saved.messages[..i.min(saved.messages.len())].to_vec();
    }

    /// Replays every assistant turn of `saved` in order (from the same settings), each
    /// from the saved messages before it. A greedy session reproduces its ids.
    pub fn replay(&mut self, saved: &SavedSession) -> Result<Vec<ReplayTurn>, ConversationError> {
        self.replay_until(saved, &|| false)
    }

    /// [`Conversation::replay`], stopping before the next turn once `cancelled()` says so;
    /// the conversation holds the saved messages afterwards either way.
    pub fn replay_until(
        &mut self,
        saved: &SavedSession,
        cancelled: &dyn Fn() -> bool,
    ) -> Result<Vec<ReplayTurn>, ConversationError> {
        self.settings = saved.settings();
        let mut turns = Vec::new();
        let mut result = Ok(());
        for (i, m) in saved.messages.iter().enumerate() {
            if m.role != Role::Assistant {
                continue;
            }
            if cancelled() {
                break;
            }
            self.rewind_to(saved, i);
            match self.reply().and_then(|r| r.run(&mut |_| {})) {
                Ok((_, ids, _)) => turns.push(ReplayTurn {
                    turn: i,
                    saved: m.ids.clone(),
                    replayed: ids,
                }),
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        self.messages = saved.messages.clone();
        result.map(|()| turns)
    }
}
