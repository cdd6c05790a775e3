//! A reasoning model's reply split into its thinking and its answer while it streams.
//!
//! Qwen3, SmolLM3 and their peers write `<think>…</think>` before the answer. The window shows
//! the thinking folded above the reply and the server returns it as `reasoning_content`, so
//! both read the stream through one [`ThinkingSplitter`], which holds back only what could
//! still turn out to be a marker.

/// The part of a reply a piece of text belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyPart {
    Thinking,
    Answer,
}

/// The template variable that turns a reasoning model's thinking on or off.
pub const THINKING_VARIABLE: &str = "enable_thinking";

pub const THINK_OPEN: &str = "<think>";
pub const THINK_CLOSE: &str = "</think>";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace yet: the reply may still open with `<think>`.
    Start,
    /// After `<think>`: newlines before the thinking's first text are dropped.
    ThinkingStart,
    Thinking,
    /// After `</think>`: whitespace before the answer's first text is dropped.
    AnswerStart,
    Answer,
}

/// Streams text in, and (part, text) pieces out in the order they were written.
#[derive(Debug, Clone)]
pub struct ThinkingSplitter {
    state: State,
    /// Text received but not yet released: a possible marker, or leading whitespace.
    pending: String,
}

impl ThinkingSplitter {
    /// `opened`: the prompt itself ends inside `<think>` (some templates open it for the
    /// model), so the reply starts in its thinking.
    pub fn new(opened: bool) -> Self {
        Self {
            state: if opened {
                State::ThinkingStart
            } else {
                State::Start
            },
            pending: String::new(),
        }
    }

    /// For a rendered prompt: whether it leaves the model inside an open `<think>`.
    pub fn for_prompt(prompt: &str) -> Self {
        let opened = prompt
            .rfind(THINK_OPEN)
            .is_some_and(|open| !prompt[open..].contains(THINK_CLOSE));
        Self::new(opened)
    }

    /// Whether the reply is in its thinking now.
    pub fn is_thinking(&self) -> bool {
        matches!(self.state, State::ThinkingStart | State::Thinking)
    }

    /// The pieces `text` completes.
    pub fn push(&mut self, text: &str) -> Vec<(ReplyPart, String)> {
        self.pending.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.state {
                State::Start => {
                    let trimmed = self.pending.trim_start();
                    if trimmed.is_empty() {
                        break;
                    }
                    if let Some(rest) = trimmed.strip_prefix(THINK_OPEN) {
                        self.pending = rest.to_owned();
                        self.state = State::ThinkingStart;
                    } else if THINK_OPEN.starts_with(trimmed) {
                        break;
                    } else {
                        self.state = State::Answer;
                    }
                }
                State::ThinkingStart => {
                    let trimmed = self.pending.trim_start_matches('\n');
                    if trimmed.is_empty() {
                        break;
                    }
                    self.pending = trimmed.to_owned();
                    self.state = State::Thinking;
                }
                State::Thinking => {
                    if let Some(close) = self.pending.find(THINK_CLOSE) {
                        let thought = self.pending[..close].trim_end_matches('\n').to_owned();
                        emit(&mut out, ReplyPart::Thinking, thought);
                        self.pending = self.pending[close + THINK_CLOSE.len()..].to_owned();
                        self.state = State::AnswerStart;
                    } else {
                        let marker = partial_marker_len(&self.pending, THINK_CLOSE);
                        let before = &self.pending[..self.pending.len() - marker];
                        let keep = marker + trailing_newlines(before);
                        let ready = self.pending.len() - keep;
                        let thought = self.pending[..ready].to_owned();
                        self.pending.drain(..ready);
                        emit(&mut out, ReplyPart::Thinking, thought);
                        break;
                    }
                }
                State::AnswerStart => {
                    let trimmed = self.pending.trim_start();
                    if trimmed.is_empty() {
                        break;
                    }
                    self.pending = trimmed.to_owned();
                    self.state = State::Answer;
                }
                State::Answer => {
                    let answer = std::mem::take(&mut self.pending);
                    emit(&mut out, ReplyPart::Answer, answer);
                    break;
                }
            }
        }
        out
    }

    /// What was held back, once the reply has ended: a thinking never closed stays
    /// thinking, and text that only looked like the start of a marker is text after all.
    pub fn finish(&mut self) -> Vec<(ReplyPart, String)> {
        let rest = std::mem::take(&mut self.pending);
        let mut out = Vec::new();
        match self.state {
            State::Thinking => emit(&mut out, ReplyPart::Thinking, rest.trim_end().to_owned()),
            State::Start | State::Answer => emit(&mut out, ReplyPart::Answer, rest),
            State::ThinkingStart | State::AnswerStart => {}
        }
        out
    }
}

fn emit(out: &mut Vec<(ReplyPart, String)>, part: ReplyPart, text: String) {
    if !text.is_empty() {
        out.push((part, text));
    }
}

/// The length of the longest end of `text` that begins `marker` (and is not all of it).
fn partial_marker_len(text: &str, marker: &str) -> usize {
    (1..marker.len())
        .rev()
        .find(|&len| text.ends_with(&marker[..len]))
        .unwrap_or(0)
}

/// Newlines at the end of `text`: the one before `</think>` is the marker's, not the
/// thinking's, so they wait until more thinking follows them.
fn trailing_newlines(text: &str) -> usize {
    text.len() - text.trim_end_matches('\n').len()
}

/// A whole reply split at once: (thinking, answer). What a finished reply stored as one
/// text (or a template's history) needs.
pub fn split_reply(text: &str) -> (Option<String>, String) {
    let mut splitter = ThinkingSplitter::new(false);
    let mut pieces = splitter.push(text);
    pieces.extend(splitter.finish());
    let mut thinking: Option<String> = None;
    let mut answer = String::new();
    for (part, text) in pieces {
        match part {
            ReplyPart::Thinking => thinking.get_or_insert_default().push_str(&text),
            ReplyPart::Answer => answer.push_str(&text),
        }
    }
    (thinking, answer)
}

/// Whether the token that took a reply from `before` to `after` is part of its thinking: the
/// reply opens with `<think>`, which was not closed before this token. Summed over a reply's
/// tokens as they come, it gives what [`thinking_tokens`] gives from them all, less any
/// white space written before `<think>`.
pub fn is_thinking_token(before: &str, after: &str) -> bool {
    !before.contains(THINK_CLOSE) && after.trim_start().starts_with(THINK_OPEN)
}

/// How many of a reply's tokens (their texts, in order) are its thinking: those up to the
/// one that closes it, or all of them while it is open.
pub fn thinking_tokens<'a>(texts: impl Iterator<Item = &'a str>) -> usize {
    let mut written = String::new();
    let mut count = 0;
    for text in texts {
        written.push_str(text);
        count += 1;
        if written.contains(THINK_CLOSE) {
            break;
        }
    }
    if written.trim_start().starts_with(THINK_OPEN) {
        count
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn joined(pieces: &[(ReplyPart, String)]) -> (String, String) {
        let mut thinking = String::new();
        let mut answer = String::new();
        for (part, text) in pieces {
            match part {
                ReplyPart::Thinking => thinking.push_str(text),
                ReplyPart::Answer => answer.push_str(text),
            }
        }
        (thinking, answer)
    }

    /// Every way of cutting a reply into streamed pieces gives the same two parts.
    #[test]
    fn any_split_of_the_stream_gives_the_same_parts() {
        let reply = "<think>\nTwo and two.\n\nFour.\n</think>\n\nIt is 4.";
        let expected = ("Two and two.\n\nFour.".to_owned(), "It is 4.".to_owned());
        for first in 0..=reply.len() {
            for second in first..=reply.len() {
                let mut splitter = ThinkingSplitter::new(false);
                let mut pieces = splitter.push(&reply[..first]);
                pieces.extend(splitter.push(&reply[first..second]));
                pieces.extend(splitter.push(&reply[second..]));
                pieces.extend(splitter.finish());
                assert_eq!(joined(&pieces), expected, "cut at {first}, {second}");
            }
        }
    }

    #[test]
    fn a_reply_without_thinking_is_all_answer() {
        let mut splitter = ThinkingSplitter::new(false);
        let mut pieces = splitter.push("  <b>bold</b> and <thin");
        pieces.extend(splitter.finish());
        assert_eq!(joined(&pieces).0, "");
        assert_eq!(joined(&pieces).1, "  <b>bold</b> and <thin");
        assert_eq!(split_reply("<thi"), (None, "<thi".to_owned()));
    }

    #[test]
    fn thinking_streams_before_it_closes() {
        let mut splitter = ThinkingSplitter::new(false);
        assert_eq!(
            splitter.push("<think>\nHm"),
            [(ReplyPart::Thinking, "Hm".to_owned())]
        );
        assert!(splitter.is_thinking());
        assert_eq!(
            splitter.push(", so</th"),
            [(ReplyPart::Thinking, ", so".to_owned())]
        );
        assert_eq!(
            splitter.push("ink>\n\nYes"),
            [(ReplyPart::Answer, "Yes".to_owned())]
        );
        assert!(!splitter.is_thinking());
    }

    /// A template that opens `<think>` for the model (DeepSeek-R1's) leaves the reply inside
    /// it; one that closes an empty one (Qwen3 with thinking off) does not.
    #[test]
    fn the_prompt_can_open_the_thinking() {
        let opened = ThinkingSplitter::for_prompt("<|Assistant|><think>\n");
        assert!(opened.is_thinking());
        let closed = ThinkingSplitter::for_prompt("<|im_start|>assistant\n<think>\n\n</think>\n\n");
        assert!(!closed.is_thinking());
        let mut splitter = opened;
        let mut pieces = splitter.push("Hmm.</think>Done");
        pieces.extend(splitter.finish());
        assert_eq!(joined(&pieces), ("Hmm.".to_owned(), "Done".to_owned()));
    }

    #[test]
    fn thinking_tokens_count_up_to_the_close() {
        let reply = ["<think>", "\n", "Hm", ".", "</think>", "\n\n", "Yes"];
        assert_eq!(thinking_tokens(reply.into_iter()), 5);
        assert_eq!(thinking_tokens(reply[..3].iter().copied()), 3);
        assert_eq!(thinking_tokens(["Yes", "<think>"].into_iter()), 0);
    }

    #[test]
    fn thinking_tokens_counted_as_they_come_agree_with_the_whole() {
        let counted = |reply: &[&str]| {
            let mut written = String::new();
            let mut count = 0;
            for token in reply {
                let before = written.clone();
                written.push_str(token);
                count += usize::from(is_thinking_token(&before, &written));
            }
            count
        };
        for reply in [
            &["<think>", "\n", "Hm", ".", "</think>", "\n\n", "Yes"][..],
            &["<think>", "Hm", "</", "think>", "Yes", "</think>"],
            &["<think>", "Still", " going"],
            &["Yes", "<think>"],
        ] {
            assert_eq!(
                counted(reply),
                thinking_tokens(reply.iter().copied()),
                "{reply:?}"
            );
        }
        assert_eq!(counted(&["\n", "<think>", "Hm", "</think>"]), 3);
    }

    #[test]
    fn an_unclosed_thinking_stays_thinking() {
        assert_eq!(
            split_reply("<think>\nStill going\n"),
            (Some("Still going".to_owned()), String::new())
        );
    }
}
