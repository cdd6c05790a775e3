//! Finding a chat by what was said in it (Ctrl+K): every chat whose title or messages hold
//! the words typed, in any case, with the words in their sentence.
//!
//! It runs on each repaint while a search is typed, over every message: a plain scan, as
//! even a few thousand chats of a few pages each are a few megabytes of text.

use crate::store::Conversation;

/// A chat that matches, and the match in its words.
#[derive(Debug, Clone, PartialEq)]
pub struct Hit {
    pub index: usize,
    /// Where the first message that holds the query holds it; `None` when only the title
    /// matched.
    pub snippet: Option<Snippet>,
}

/// The words found, as the message spells them, between some of the words around them (on
/// one line, cut with an ellipsis), so the list can mark the words themselves.
#[derive(Debug, Clone, PartialEq)]
pub struct Snippet {
    pub before: String,
    pub found: String,
    pub after: String,
}

/// The chats of `conversations` (by index, in their order) that hold `query`.
pub fn search(conversations: &[Conversation], query: &str) -> Vec<Hit> {
    let query: Vec<char> = query.trim().chars().map(fold).collect();
    if query.is_empty() {
        return Vec::new();
    }
    conversations
        .iter()
        .enumerate()
        .filter_map(|(index, conversation)| {
            let snippet = conversation
                .messages
                .iter()
                .find_map(|message| snippet(&message.content, &query));
            let title = find(&conversation.title, &query).is_some();
            (title || snippet.is_some()).then_some(Hit { index, snippet })
        })
        .collect()
}

/// Characters shown before the match, and after it.
const BEFORE: usize = 30;
const AFTER: usize = 50;

fn snippet(text: &str, query: &[char]) -> Option<Snippet> {
    let (start, end) = find(text, query)?;
    let before: Vec<char> = text[..start].chars().rev().take(BEFORE + 1).collect();
    let after: Vec<char> = text[end..].chars().take(AFTER + 1).collect();
    let mut shown_before = String::new();
    if before.len() > BEFORE {
        shown_before.push('\u{2026}');
    }
    shown_before.extend(
        before
            .iter()
            .rev()
            .skip(before.len().saturating_sub(BEFORE)),
    );
    let mut shown_after: String = after.iter().take(AFTER).collect();
    if after.len() > AFTER {
        shown_after.push('\u{2026}');
    }
    Some(Snippet {
        before: one_line(&shown_before).trim_start().to_string(),
        found: one_line(&text[start..end]),
        after: one_line(&shown_after).trim_end().to_string(),
    })
}

/// Each run of white space (line breaks included) as one space.
fn one_line(text: &str) -> String {
    let mut line = String::with_capacity(text.len());
    let mut in_space = false;
    for c in text.chars() {
        if c.is_whitespace() {
            if !in_space {
                line.push(' ');
            }
            in_space = true;
        } else {
            line.push(c);
            in_space = false;
        }
    }
    line
}

/// The byte range of the first place `text` holds `query` (already folded), in any case.
fn find(text: &str, query: &[char]) -> Option<(usize, usize)> {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    (0..chars.len().checked_sub(query.len())? + 1)
        .find(|&start| {
            query
                .iter()
                .zip(&chars[start..])
                .all(|(&wanted, &(_, c))| fold(c) == wanted)
        })
        .map(|start| {
            let end = chars
                .get(start + query.len())
                .map_or(text.len(), |&(at, _)| at);
            (chars[start].0, end)
        })
}

/// One character's lower case, for matching in any case.
fn fold(c: char) -> char {
    c.to_lowercase().next().unwrap_or(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoredMessage;
    use crate::text::Role;

    fn chat(title: &str, messages: &[&str]) -> Conversation {
        let mut conversation = Conversation::new();
        conversation.title = title.into();
        for (turn, text) in messages.iter().enumerate() {
            let role = if turn % 2 == 0 {
                Role::User
            } else {
                Role::Assistant
            };
            conversation.messages.push(StoredMessage::new(role, *text));
        }
        conversation
    }

    #[test]
    fn chats_are_found_by_their_words_in_any_case() {
        let chats = [
            chat(
                "Rain",
                &["Write a haiku about rain", "Grey clouds gather slow"],
            ),
            chat("Capitals", &["What is the capital of France?", "Paris."]),
            chat("Über Straße", &["Wie heißt die STRASSE?"]),
        ];
        assert_eq!(
            search(&chats, "PARIS"),
            [Hit {
                index: 1,
                snippet: Some(Snippet {
                    before: String::new(),
                    found: "Paris".into(),
                    after: ".".into(),
                })
            }]
        );
        assert_eq!(
            search(&chats, "rain"),
            [Hit {
                index: 0,
                snippet: Some(Snippet {
                    before: "Write a haiku about ".into(),
                    found: "rain".into(),
                    after: String::new(),
                })
            }]
        );
        assert_eq!(
            search(&chats, "über"),
            [Hit {
                index: 2,
                snippet: None
            }],
            "the title alone"
        );
        assert_eq!(search(&chats, "heiß")[0].index, 2);
        assert!(search(&chats, "  ").is_empty());
        assert!(search(&chats, "volcano").is_empty());
    }

    #[test]
    fn a_long_message_is_cut_around_the_match() {
        let long = format!("{} needle {}", "before ".repeat(20), "after\n".repeat(20));
        let chats = [chat("Long", &[&long])];
        let found = search(&chats, "needle")[0].snippet.clone().unwrap();
        assert_eq!(found.found, "needle");
        let snippet = format!("{}{}{}", found.before, found.found, found.after);
        assert!(snippet.starts_with('\u{2026}') && snippet.ends_with('\u{2026}'));
        assert!(snippet.contains("before needle after"), "{snippet}");
        assert!(!snippet.contains('\n'));
        assert!(snippet.chars().count() <= BEFORE + AFTER + 10, "{snippet}");
    }
}
