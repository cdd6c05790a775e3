//! Turning generated ids into text one token at a time for the streaming UI.
//! Byte-level BPE tokens can end in the middle of a UTF-8 character, and decoding
//! a lone token can lose the space that joins it to the previous word, so each
//! step decodes a short window of recent ids and emits only what is new.

use super::error::Result;
use super::tokenizer::TextTokenizer;

#[derive(Debug)]
pub struct StreamDecoder<'a> {
    tokenizer: &'a TextTokenizer,
    skip_special_tokens: bool,
    ids: Vec<u32>,
    /// Start of the window re-decoded for context; text before it is final.
    prefix_offset: usize,
    /// End of the text already emitted.
    read_offset: usize,
}

impl<'a> StreamDecoder<'a> {
    pub fn new(tokenizer: &'a TextTokenizer, skip_special_tokens: bool) -> Self {
        Self {
            tokenizer,
            skip_special_tokens,
            ids: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
        }
    }

    /// Adds one generated id; returns the text it completes, or `None` while the
    /// id only carries part of a character.
    pub fn push(&mut self, id: u32) -> Result<Option<String>> {
        self.ids.push(id);
        let (emitted, text) = self.decode_window()?;
        // U+FFFD at the end means the last bytes are an unfinished character.
        if text.len() <= emitted.len() || text.ends_with('\u{FFFD}') {
            return Ok(None);
        }
        Ok(self.take_new_text(&emitted, text))
    }

    /// Returns whatever is still held back, e.g. when generation stops mid-character.
    pub fn finish(&mut self) -> Result<Option<String>> {
        if self.read_offset == self.ids.len() {
            return Ok(None);
        }
        let (emitted, text) = self.decode_window()?;
        Ok(self.take_new_text(&emitted, text))
    }

    /// Every id pushed so far.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// The window's text up to what was already emitted, and with all ids.
    fn decode_window(&self) -> Result<(String, String)> {
        let decode = |ids: &[u32]| self.tokenizer.decode(ids, self.skip_special_tokens);
        let emitted = decode(&self.ids[self.prefix_offset..self.read_offset])?;
        let text = decode(&self.ids[self.prefix_offset..])?;
        Ok((emitted, text))
    }

    fn take_new_text(&mut self, emitted: &str, text: String) -> Option<String> {
        // Decoding more ids normally only appends; if a decoder rewrote the
        // overlap, fall back to cutting at the same byte length.
        let new_text = text
            .strip_prefix(emitted)
            .or_else(|| text.get(emitted.len()..))?
            .to_owned();
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        (!new_text.is_empty()).then_some(new_text)
    }
}
