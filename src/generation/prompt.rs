//! A request's prompt as token ids that fit the context: the one rule the engine and
//! `smolchat generate` share, so that both keep the same room for the reply and refuse the
//! same prompts.

use super::error::GenerationError;
use super::loaded_model::LoadedModel;
use crate::text::{
    ChatMessage, ContextWindow, FittedPrompt, OverflowPolicy, TemplateVariables, TextError,
};

/// What to say, as it is turned into prompt tokens.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// A conversation, rendered with the model's chat template and ending with the assistant's
    /// header.
    Chat(Vec<ChatMessage>),
    /// Text to continue as it is: no template, no special tokens added.
    Raw(String),
}

/// How the prompt is fitted: the reply's budget and what to do when the conversation is too
/// long for the context.
pub struct PromptFit<'a> {
    /// The context the model gets.
    pub limit: usize,
    pub max_new_tokens: Option<usize>,
    pub overflow: OverflowPolicy,
    pub variables: &'a TemplateVariables,
}

impl PromptFit<'_> {
    /// The prompt's ids, how many of the oldest messages were left out to fit, and how many
    /// ids come before its last message's text (none for a raw prompt). Room is kept for the
    /// reply: its budget, at most half the context, or one token without one.
    pub fn ids(
        &self,
        loaded: &LoadedModel,
        prompt: &Prompt,
    ) -> Result<FittedPrompt, GenerationError> {
        let reserve_for_reply = self
            .max_new_tokens
            .map_or(1, |tokens| tokens.clamp(1, self.limit / 2));
        match prompt {
            Prompt::Chat(messages) => {
                let window = ContextWindow {
                    limit: self.limit,
                    reserve_for_reply,
                    policy: self.overflow,
                };
                Ok(window.fit(
                    messages,
                    &loaded.template,
                    self.variables,
                    &loaded.tokenizer,
                )?)
            }
            Prompt::Raw(text) => {
                let ids = loaded.tokenizer.encode(text, false)?;
                if ids.is_empty() {
                    return Err(GenerationError::EmptyPrompt);
                }
                let needed = ids.len().saturating_add(reserve_for_reply);
                if needed > self.limit {
                    let limit = self.limit;
                    return Err(TextError::ContextFull { needed, limit }.into());
                }
                Ok(FittedPrompt {
                    ids,
                    dropped_messages: 0,
                    history: 0,
                })
            }
        }
    }
}
