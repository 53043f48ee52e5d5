//! Chat: the file's tokenizer and its chat bundle (spec §6, §6.1).
//!
//! A CMF file is self-contained: the vocab section holds `tokenizer.json` and
//! `header.tokenizer_config` holds the chat template and the stop ids. [`ChatBundle`] puts
//! both together: render a conversation the way Hugging Face's `apply_chat_template` does
//! ([`template`]), tokenize the prompt, and know where generation stops ([`tokenizer`]).

pub mod conversation;
mod pyfmt;
mod strftime;
pub mod template;
pub mod tokenizer;

pub use template::{ChatTemplate, RenderOptions, CHATML_TEMPLATE};
pub use tokenizer::{TextStream, Tokenizer};

use crate::format::header::TokenizerConfig;
use crate::format::shards::CmfModel;
use crate::format::CmfFile;

/// Everything that can go wrong between a conversation and token ids.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    /// The template source does not compile (a jinja syntax error, with its location).
    #[error("the chat template does not compile: {0}")]
    Syntax(String),
    /// The template refused the conversation by calling `raise_exception(message)`;
    /// holds the template's message as written.
    #[error("{0}")]
    Raised(String),
    /// Rendering failed otherwise: an attribute of an undefined value, a type error,
    /// an unknown filter or method (with the template location).
    #[error("the chat template failed: {0}")]
    Render(String),
    /// Rendering hit a bound that a template from a model file (hostile input) runs under:
    /// [`template::FUEL`] (work and data), [`template::MAX_OUTPUT_BYTES`] (the prompt),
    /// [`template::MAX_STRING_BYTES`] (one printed or serialized value),
    /// [`template::MAX_RANGE_ITEMS`], [`template::MAX_NESTING`]. Names the limit.
    #[error("the chat template exceeded a limit: {0}")]
    Limit(String),
    /// The input is not what a chat template takes (messages not a JSON array, ...).
    #[error("invalid chat input: {0}")]
    Input(String),
    /// `tokenizer.json` does not load, or encoding/decoding failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// Token ids were asked for but the file has no vocab section.
    #[error("the file has no tokenizer (no vocab section)")]
    NoTokenizer,
}

/// Where the bundle's template came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TemplateOrigin {
    /// `header.tokenizer_config.chat_template`.
    File,
    /// The file carries none (or an empty one): [`CHATML_TEMPLATE`].
    ChatMl,
    /// Given by the caller ([`ChatBundle::with_template`]).
    Custom,
}

impl TemplateOrigin {
    /// `"file"`, `"chatml"` or `"custom"`.
    pub fn as_str(self) -> &'static str {
        match self {
            TemplateOrigin::File => "file",
            TemplateOrigin::ChatMl => "chatml",
            TemplateOrigin::Custom => "custom",
        }
    }
}

/// Where the stop ids came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EosOrigin {
    /// `header.tokenizer_config.eos_token_ids`.
    File,
    /// The file lists none: the end tokens of [`FALLBACK_EOS_TOKENS`] the tokenizer has.
    Tokenizer,
}

/// Tokens that end a turn or a text in the common families, tried when a file lists no
/// `eos_token_ids`: ChatML, Llama 3, Gemma, GPT-2/Qwen base, Llama/Mistral, Gemma base.
pub const FALLBACK_EOS_TOKENS: [&str; 6] = [
    "<|im_end|>",
    "<|eot_id|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<eos>",
];

/// A file's chat behaviour: template, tokenizer, special tokens and stop ids.
#[derive(Debug)]
pub struct ChatBundle {
    template: ChatTemplate,
    origin: TemplateOrigin,
    tokenizer: Option<Tokenizer>,
    eos_token_ids: Vec<u32>,
    eos_origin: EosOrigin,
    bos_token_id: Option<u32>,
    pad_token_id: Option<u32>,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl ChatBundle {
    /// The bundle of an open model (its primary shard carries vocab and header).
    pub fn from_model(model: &CmfModel) -> Result<ChatBundle, ChatError> {
        ChatBundle::from_file(model.primary())
    }

    /// The bundle of one open file.
    pub fn from_file(file: &CmfFile) -> Result<ChatBundle, ChatError> {
        ChatBundle::from_parts(file.vocab_bytes(), file.header.tokenizer_config.as_ref())
    }

    /// The bundle from its pieces: `tokenizer.json` bytes (if any) and the header's
    /// `tokenizer_config` (if any).
    ///
    /// - template: the config's `chat_template`, or ChatML when it is absent or blank;
    /// - stop ids: the config's `eos_token_ids`, or else every [`FALLBACK_EOS_TOKENS`]
    ///   entry the tokenizer knows;
    /// - `bos_token` / `eos_token` template variables: a `bos_token` / `eos_token` string
    ///   in the config (kept among its unknown keys) when present, else the tokenizer's
    ///   text of `bos_token_id` / of the first stop id. HF takes them from
    ///   `tokenizer_config.json`, which a CMF file does not keep; the first stop id is the
    ///   model's `eos_token_id`, which is the tokenizer's EOS for the families we know.
    pub fn from_parts(
        tokenizer_json: Option<&[u8]>,
        config: Option<&TokenizerConfig>,
    ) -> Result<ChatBundle, ChatError> {
        let tokenizer = tokenizer_json.map(Tokenizer::from_bytes).transpose()?;
        let file_template = config
            .and_then(|c| c.chat_template.as_deref())
            .filter(|t| !t.trim().is_empty());
        let (template, origin) = match file_template {
            Some(src) => (ChatTemplate::new(src)?, TemplateOrigin::File),
            None => (ChatTemplate::new(CHATML_TEMPLATE)?, TemplateOrigin::ChatMl),
        };
        let listed = config.map(|c| c.eos_token_ids.clone()).unwrap_or_default();
        let (eos_token_ids, eos_origin) = if listed.is_empty() {
            let found = tokenizer
                .as_ref()
                .map(|t| {
                    FALLBACK_EOS_TOKENS
                        .iter()
                        .filter_map(|s| t.token_to_id(s))
                        .collect()
                })
                .unwrap_or_default();
            (found, EosOrigin::Tokenizer)
        } else {
            (listed, EosOrigin::File)
        };
        let bos_token_id = config.and_then(|c| c.bos_token_id);
        let text_of =
            |id: Option<u32>| id.and_then(|id| tokenizer.as_ref().and_then(|t| t.id_to_token(id)));
        let configured = |key: &str| {
            config
                .and_then(|c| c.extra.get(key))
                .and_then(|v| v.as_str())
                .map(str::to_string)
        };
        let bos_token = configured("bos_token").or_else(|| text_of(bos_token_id));
        let eos_token = configured("eos_token").or_else(|| text_of(eos_token_ids.first().copied()));
        Ok(ChatBundle {
            template,
            origin,
            eos_token_ids,
            eos_origin,
            bos_token_id,
            pad_token_id: config.and_then(|c| c.pad_token_id),
            bos_token,
            eos_token,
            tokenizer,
        })
    }

    /// The same bundle with another template (e.g. one given on the command line).
    pub fn with_template(mut self, source: &str) -> Result<ChatBundle, ChatError> {
        self.template = ChatTemplate::new(source)?;
        self.origin = TemplateOrigin::Custom;
        Ok(self)
    }

    pub fn template(&self) -> &ChatTemplate {
        &self.template
    }

    pub fn template_origin(&self) -> TemplateOrigin {
        self.origin
    }

    /// Whether the template is the ChatML fallback (the file carries none).
    pub fn is_fallback(&self) -> bool {
        self.origin == TemplateOrigin::ChatMl
    }

    /// The file's tokenizer; `None` when it has no vocab section.
    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.tokenizer.as_ref()
    }

    /// Generation stops at any of these ids.
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_token_ids
    }

    pub fn eos_origin(&self) -> EosOrigin {
        self.eos_origin
    }

    pub fn is_eos(&self, id: u32) -> bool {
        self.eos_token_ids.contains(&id)
    }

    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos_token_id
    }

    pub fn pad_token_id(&self) -> Option<u32> {
        self.pad_token_id
    }

    /// The `bos_token` template variable.
    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    /// The `eos_token` template variable.
    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// Renders a conversation with this bundle's template; `bos_token`/`eos_token` not
    /// set in `opts` come from the bundle.
    pub fn render_chat(
        &self,
        messages: &serde_json::Value,
        opts: &RenderOptions,
    ) -> Result<String, ChatError> {
        let mut opts = opts.clone();
        if opts.bos_token.is_none() {
            opts.bos_token = self.bos_token.clone();
        }
        if opts.eos_token.is_none() {
            opts.eos_token = self.eos_token.clone();
        }
        self.template.render(messages, &opts)
    }

    /// Token ids of a rendered prompt. Like HF's `apply_chat_template(tokenize=True)` this
    /// adds no special tokens: the template already wrote the ones the model expects.
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>, ChatError> {
        self.tokenizer
            .as_ref()
            .ok_or(ChatError::NoTokenizer)?
            .encode(text, false)
    }
}
