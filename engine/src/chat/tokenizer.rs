//! The file's own tokenizer (spec §6: the vocab section holds `tokenizer.json` verbatim),
//! through the `tokenizers` crate, plus an incremental detokenizer for streaming output.

use super::ChatError;

fn tok_err(context: &str, e: impl std::fmt::Display) -> ChatError {
    ChatError::Tokenizer(format!("{context}: {e}"))
}

/// A Hugging Face tokenizer loaded from `tokenizer.json` bytes.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Parses a `tokenizer.json` document.
    pub fn from_bytes(tokenizer_json: &[u8]) -> Result<Tokenizer, ChatError> {
        let inner = tokenizers::Tokenizer::from_bytes(tokenizer_json)
            .map_err(|e| tok_err("tokenizer.json does not load", e))?;
        Ok(Tokenizer { inner })
    }

    /// The underlying `tokenizers` object, for what this wrapper does not cover.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// Token ids of `text`. Special tokens written in the text (`<|im_start|>`) are
    /// recognised either way; `add_special_tokens` adds what the post-processor adds
    /// (a BOS for Llama-style tokenizers) — a rendered chat prompt already carries those,
    /// so HF encodes it with `false`.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, ChatError> {
        let enc = self
            .inner
            .encode_fast(text, add_special_tokens)
            .map_err(|e| tok_err("encoding failed", e))?;
        Ok(enc.get_ids().to_vec())
    }

    /// The text of `ids`; ids the vocabulary does not know are left out (as `tokenizers`
    /// does).
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, ChatError> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| tok_err("decoding failed", e))
    }

    /// The id of a token given by its vocabulary string (`<|im_end|>`, `Ġthe`).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The vocabulary string of an id.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Number of distinct tokens, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Whether `id` is a special added token (what `skip_special_tokens` drops).
    pub fn is_special(&self, id: u32) -> bool {
        self.inner
            .get_added_vocabulary()
            .simple_id_to_token(id)
            .is_some_and(|t| self.inner.get_added_vocabulary().is_special_token(&t))
    }

    /// A streaming detokenizer over this tokenizer.
    pub fn stream(&self, skip_special_tokens: bool) -> TextStream<'_> {
        TextStream::new(self, skip_special_tokens)
    }
}

/// Turns generated ids into text piece by piece.
///
/// Decoding ids one at a time is wrong twice over: byte-level BPE tokens may each carry
/// part of one UTF-8 character, and decoders such as Metaspace treat the first token of a
/// sequence differently (they drop its leading space). So each step decodes a short window
/// — the ids already emitted since the previous boundary (`prefix_offset..read_offset`)
/// plus the new ones — and emits the difference from the window's previous text, holding
/// everything back while that text ends in U+FFFD (an incomplete character).
///
/// The concatenation of every [`step`](TextStream::step) piece and [`finish`](TextStream::finish)
/// equals `decode(all ids)` for the decoders HF ships.
#[derive(Debug)]
pub struct TextStream<'t> {
    tokenizer: &'t Tokenizer,
    skip_special_tokens: bool,
    ids: Vec<u32>,
    /// Start of the context window: the ids before the last emitted piece.
    prefix_offset: usize,
    /// End of what has been emitted.
    read_offset: usize,
}

impl<'t> TextStream<'t> {
    pub fn new(tokenizer: &'t Tokenizer, skip_special_tokens: bool) -> TextStream<'t> {
        TextStream {
            tokenizer,
            skip_special_tokens,
            ids: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
        }
    }

    /// Feeds one id; returns the text it completes, or `None` while the text so far ends
    /// inside a character (or the id adds no text, e.g. a skipped special token).
    pub fn step(&mut self, id: u32) -> Result<Option<String>, ChatError> {
        self.ids.push(id);
        let prefix = self.decode(self.prefix_offset, self.read_offset)?;
        let text = self.decode(self.prefix_offset, self.ids.len())?;
        if text.len() <= prefix.len() || text.ends_with('\u{FFFD}') {
            return Ok(None);
        }
        let piece = suffix_after(&text, &prefix).to_string();
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        Ok(Some(piece))
    }

    /// Ends the stream: whatever is still held back (an incomplete character at the very
    /// end decodes to U+FFFD, as `decode` would show it), or `None` when nothing is.
    pub fn finish(&mut self) -> Result<Option<String>, ChatError> {
        if self.read_offset == self.ids.len() {
            return Ok(None);
        }
        let prefix = self.decode(self.prefix_offset, self.read_offset)?;
        let text = self.decode(self.prefix_offset, self.ids.len())?;
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        let piece = suffix_after(&text, &prefix);
        Ok((!piece.is_empty()).then(|| piece.to_string()))
    }

    /// Every id fed so far.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    fn decode(&self, from: usize, to: usize) -> Result<String, ChatError> {
        self.tokenizer
            .decode(&self.ids[from..to], self.skip_special_tokens)
    }
}

/// The part of `text` after `prefix`. Normally `prefix` is a prefix of `text`; if a
/// decoder rewrote earlier text once more context arrived, the part after the longest
/// common prefix (on a character boundary) is the best that can still be emitted.
fn suffix_after<'a>(text: &'a str, prefix: &str) -> &'a str {
    if let Some(rest) = text.strip_prefix(prefix) {
        return rest;
    }
    let common = text
        .char_indices()
        .zip(prefix.chars())
        .find(|((_, a), b)| a != b)
        .map(|((i, _), _)| i)
        .unwrap_or(prefix.len().min(text.len()));
    &text[common..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffix_after_handles_rewrites() {
        assert_eq!(suffix_after("hello world", "hello"), " world");
        assert_eq!(suffix_after("héllo", "h\u{FFFD}"), "éllo");
    }

    #[test]
    fn stream_over_demo_tokenizer() {
        // The synthetic tokenizer has only the 256 byte tokens: every multi-byte character
        // spans several ids, so the stream must hold bytes back.
        let (json, _) = crate::synth::demo_tokenizer_json();
        let tok = Tokenizer::from_bytes(&json).unwrap();
        let text = "añ日本😀!";
        let ids = tok.encode(text, false).unwrap();
        assert_eq!(ids.len(), text.len());
        let mut stream = tok.stream(false);
        let mut out = String::new();
        let mut held = 0;
        for &id in &ids {
            match stream.step(id).unwrap() {
                Some(p) => {
                    assert!(!p.contains('\u{FFFD}'), "{p:?}");
                    out.push_str(&p);
                }
                None => held += 1,
            }
        }
        assert!(stream.finish().unwrap().is_none());
        assert_eq!(out, text);
        assert_eq!(held, text.len() - text.chars().count());
    }
}
