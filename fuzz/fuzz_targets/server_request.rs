//! libFuzzer entry point for API request bodies: any bytes, for either endpoint, must give a
//! request or an OpenAI-shaped error naming what is wrong, never a panic.
#![no_main]

use smolchat::server::{Endpoint, parse_request};
use smolchat_fuzz::fuzz_target;

fuzz_target!(|data| {
    let Some((&first, body)) = data.split_first() else {
        return;
    };
    let endpoint = if first & 1 == 0 {
        Endpoint::Chat
    } else {
        Endpoint::Completions
    };
    let served = ["smollm".to_string()];
    if let Err(error) = parse_request(endpoint, body, &served) {
        assert!(!error.message.is_empty());
        assert!(error.status.is_client_error(), "{error:?}");
    }
});
