//! Fitting a conversation into the model's context window. Long chats outgrow
//! it, and cutting tokens from the middle of a prompt confuses the model, so
//! whole early turns are left out and the user is told how many.

use serde::{Deserialize, Serialize};

use super::chat_template::{ChatMessage, ChatTemplate, PromptPiece, Role, TemplateVariables};
use super::error::{Result, TextError};
use super::tokenizer::TextTokenizer;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OverflowPolicy {
    /// Leave out the oldest turns until the rest fits.
    #[default]
    DropOldestTurns,
    /// Refuse to generate rather than silently forget anything.
    Stop,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContextWindow {
    /// Tokens the model can attend to (prompt plus reply).
    pub limit: usize,
    /// Tokens kept free for the reply.
    pub reserve_for_reply: usize,
    pub policy: OverflowPolicy,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FittedPrompt {
    /// The prompt ids, ending with the assistant header.
    pub ids: Vec<u32>,
    /// How many of the oldest non-system messages were left out.
    pub dropped_messages: usize,
    /// How many leading ids render the conversation before what its last system or user
    /// message says: another request that differs only from there on (a new question after
    /// the same system prompt) has the same ones.
    pub history: usize,
}

/// The prompt ids of `messages` with the generation prompt, then `unfinished`.
///
/// Rendered and tokenized whole, as transformers does, unless a system or user message spells
/// a special token (`<|im_start|>system` pasted into a message): then what people wrote is
/// tokenized as text, so that it cannot forge the template's markers, and only the template's
/// own text maps to special tokens.
fn encode_chat(
    messages: &[ChatMessage],
    unfinished: &str,
    template: &ChatTemplate,
    variables: &TemplateVariables,
    tokenizer: &TextTokenizer,
) -> Result<Vec<u32>> {
    if !forges_markers(messages, tokenizer) {
        let mut text = template.render_with(messages, true, variables)?;
        text.push_str(unfinished);
        return tokenizer.encode(&text, false);
    }
    let mut pieces = template.render_pieces(messages, true, variables)?;
    match pieces.last_mut() {
        Some(PromptPiece::Template(last)) => last.push_str(unfinished),
        _ => pieces.push(PromptPiece::Template(unfinished.to_owned())),
    }
    encode_pieces(&pieces, tokenizer)
}

/// Whether a system or user message spells one of the tokenizer's special tokens.
fn forges_markers(messages: &[ChatMessage], tokenizer: &TextTokenizer) -> bool {
    messages
        .iter()
        .any(|m| m.role != Role::Assistant && tokenizer.spells_special_token(&m.content))
}

/// What people wrote tokenized as text, the template's own text as it is.
fn encode_pieces(pieces: &[PromptPiece], tokenizer: &TextTokenizer) -> Result<Vec<u32>> {
    let mut ids = Vec::new();
    for piece in pieces {
        ids.extend(match piece {
            PromptPiece::Template(text) => tokenizer.encode(text, false)?,
            PromptPiece::Written(text) => tokenizer.encode_as_text(text)?,
        });
    }
    Ok(ids)
}

/// [`FittedPrompt::history`] of `ids`, the prompt of `messages`: as many of them as the
/// rendering up to the last system or user message's text tokenizes to alike (a token the
/// tokenizer would merge across that point is left to the message).
fn history_of(
    ids: &[u32],
    messages: &[ChatMessage],
    template: &ChatTemplate,
    variables: &TemplateVariables,
    tokenizer: &TextTokenizer,
) -> Result<usize> {
    let mut pieces = template.render_pieces(messages, true, variables)?;
    let Some(last) = pieces
        .iter()
        .rposition(|piece| matches!(piece, PromptPiece::Written(_)))
    else {
        return Ok(0);
    };
    pieces.truncate(last);
    let before = match forges_markers(messages, tokenizer) {
        true => encode_pieces(&pieces, tokenizer)?,
        false => {
            let text: String = pieces
                .iter()
                .map(|piece| match piece {
                    PromptPiece::Template(text) | PromptPiece::Written(text) => text.as_str(),
                })
                .collect();
            tokenizer.encode(&text, false)?
        }
    };
    Ok(before.iter().zip(ids).take_while(|(a, b)| a == b).count())
}

impl ContextWindow {
    /// Renders the conversation (with the generation prompt) and makes it fit.
    /// A leading system message is always kept whole; messages are dropped oldest
    /// first and only up to a user message, so the conversation still opens with
    /// a user turn; the last user message is never dropped.
    ///
    /// A conversation that ends with an assistant message is a reply to continue: the prompt
    /// ends with that reply's text where the template would open a new reply.
    pub fn fit(
        &self,
        messages: &[ChatMessage],
        template: &ChatTemplate,
        variables: &TemplateVariables,
        tokenizer: &TextTokenizer,
    ) -> Result<FittedPrompt> {
        let (messages, unfinished) = match messages.split_last() {
            Some((last, earlier)) if last.role == Role::Assistant => (earlier, last.written()),
            _ => (messages, String::new()),
        };
        let system_len = usize::from(messages.first().map(|m| m.role) == Some(Role::System));
        let (system, turns) = messages.split_at(system_len);
        let kept = |dropped: usize| -> Vec<ChatMessage> {
            system.iter().chain(&turns[dropped..]).cloned().collect()
        };
        let encode_without = |dropped: usize| -> Result<Vec<u32>> {
            encode_chat(&kept(dropped), &unfinished, template, variables, tokenizer)
        };
        let (ids, dropped_messages) = self.fit_ids(turns, &encode_without)?;
        Ok(FittedPrompt {
            history: history_of(
                &ids,
                &kept(dropped_messages),
                template,
                variables,
                tokenizer,
            )?,
            ids,
            dropped_messages,
        })
    }

    /// [`ContextWindow::fit`]'s ids and how many of the oldest `turns` they leave out;
    /// `encode_without(n)` encodes the conversation without its `n` oldest turns.
    fn fit_ids(
        &self,
        turns: &[ChatMessage],
        encode_without: &dyn Fn(usize) -> Result<Vec<u32>>,
    ) -> Result<(Vec<u32>, usize)> {
        let full = encode_without(0)?;
        if self.fits(&full) {
            return Ok((full, 0));
        }
        if self.policy == OverflowPolicy::Stop {
            return Err(self.full_error(&full));
        }

        // Cutting just before a user message keeps turns paired; the last user
        // message is the latest possible cut.
        let last_user = turns.iter().rposition(|m| m.role == Role::User);
        let cuts: Vec<usize> = (1..=last_user.unwrap_or(0))
            .filter(|&index| turns[index].role == Role::User)
            .collect();

        // Dropping more never makes the prompt longer, so the first cut that fits
        // can be found by bisection instead of re-tokenizing every candidate.
        let (mut low, mut high) = (0, cuts.len());
        let mut best = None;
        while low < high {
            let middle = low + (high - low) / 2;
            let ids = encode_without(cuts[middle])?;
            if self.fits(&ids) {
                best = Some((cuts[middle], ids));
                high = middle;
            } else {
                low = middle + 1;
            }
        }
        match best {
            Some((dropped_messages, ids)) => Ok((ids, dropped_messages)),
            None => {
                let smallest = match cuts.last() {
                    Some(&cut) => encode_without(cut)?,
                    None => full,
                };
                Err(self.full_error(&smallest))
            }
        }
    }

    fn fits(&self, prompt: &[u32]) -> bool {
        prompt.len().saturating_add(self.reserve_for_reply) <= self.limit
    }

    fn full_error(&self, prompt: &[u32]) -> TextError {
        TextError::ContextFull {
            needed: prompt.len().saturating_add(self.reserve_for_reply),
            limit: self.limit,
        }
    }
}
