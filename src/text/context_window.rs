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
    let forged = messages
        .iter()
        .any(|m| m.role != Role::Assistant && tokenizer.spells_special_token(&m.content));
    if !forged {
        let mut text = template.render_with(messages, true, variables)?;
        text.push_str(unfinished);
        return tokenizer.encode(&text, false);
    }
    let mut pieces = template.render_pieces(messages, true, variables)?;
    match pieces.last_mut() {
        Some(PromptPiece::Template(last)) => last.push_str(unfinished),
        _ => pieces.push(PromptPiece::Template(unfinished.to_owned())),
    }
    let mut ids = Vec::new();
    for piece in pieces {
        ids.extend(match piece {
            PromptPiece::Template(text) => tokenizer.encode(&text, false)?,
            PromptPiece::Written(text) => tokenizer.encode_as_text(&text)?,
        });
    }
    Ok(ids)
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

        let encode_without = |dropped: usize| -> Result<Vec<u32>> {
            let kept: Vec<ChatMessage> = system.iter().chain(&turns[dropped..]).cloned().collect();
            encode_chat(&kept, &unfinished, template, variables, tokenizer)
        };

        let full = encode_without(0)?;
        if self.fits(&full) {
            return Ok(FittedPrompt {
                ids: full,
                dropped_messages: 0,
            });
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
            Some((dropped_messages, ids)) => Ok(FittedPrompt {
                ids,
                dropped_messages,
            }),
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
