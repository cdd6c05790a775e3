//! Looking for models on the hub from the library page: a search, and one repository's
//! files, each asked on a thread of its own, so that the window never waits on the network.

use crossbeam_channel::{Receiver, TryRecvError};

use crate::generation::available_memory;
use crate::hub::{FoundModel, HubError, HubOptions, ModelDownloader, RepositoryFile};

/// An answer about `.0` (the query, or the repository), or why there is none.
pub type Answer<T> = (String, Result<Vec<T>, String>);

pub struct HubSearch {
    /// `None` where no Hugging Face cache folder can be found: nothing can be downloaded.
    options: Option<HubOptions>,
    found: Option<Answer<FoundModel>>,
    searching: Option<Receiver<Answer<FoundModel>>>,
    files: Option<Answer<RepositoryFile>>,
    listing: Option<Receiver<Answer<RepositoryFile>>>,
    /// The memory free when the files came, which they are measured against.
    free_memory: Option<u64>,
}

impl HubSearch {
    pub fn new(options: Option<HubOptions>) -> Self {
        Self {
            options,
            found: None,
            searching: None,
            files: None,
            listing: None,
            free_memory: None,
        }
    }

    /// Repositories matching `query`; the answer replaces the last one's.
    pub fn search(&mut self, query: String) {
        self.files = None;
        self.searching = Some(self.ask(query, |hub, query| hub.search(query, SHOWN)));
    }

    /// The files of repository `model_id`, shown under it.
    pub fn list_files(&mut self, model_id: String) {
        self.listing = Some(self.ask(model_id, |hub, id| hub.repository_files(id)));
    }

    /// Takes in the answers that have arrived. Never blocks.
    pub fn poll(&mut self) {
        take(&mut self.searching, &mut self.found);
        let listing = self.listing.is_some();
        take(&mut self.listing, &mut self.files);
        if listing && self.listing.is_none() {
            self.free_memory = available_memory();
        }
    }

    /// The memory free when the last files came, read once rather than every frame.
    pub fn free_memory(&self) -> Option<u64> {
        self.free_memory
    }

    /// Whether an answer is awaited: nothing wakes the window when it comes.
    pub fn busy(&self) -> bool {
        self.searching.is_some() || self.listing.is_some()
    }

    pub fn searching(&self) -> bool {
        self.searching.is_some()
    }

    pub fn found(&self) -> Option<&Answer<FoundModel>> {
        self.found.as_ref()
    }

    pub fn files(&self) -> Option<&Answer<RepositoryFile>> {
        self.files.as_ref()
    }

    /// Runs `question` about `subject` on a thread of its own; without a cache folder or a
    /// thread, the answer is why not.
    fn ask<T: Send + 'static>(
        &self,
        subject: String,
        question: fn(&ModelDownloader, &str) -> Result<Vec<T>, HubError>,
    ) -> Receiver<Answer<T>> {
        let (answer, answered) = crossbeam_channel::bounded(1);
        let Some(options) = self.options.clone() else {
            let _ = answer.send((subject, Err(HubError::NoCacheDir.to_string())));
            return answered;
        };
        let (asked, reply) = (subject.clone(), answer.clone());
        let started = std::thread::Builder::new()
            .name("smolchat-hub-search".into())
            .spawn(move || {
                let result = question(&ModelDownloader::new(options), &asked);
                let _ = reply.send((asked, result.map_err(|err| err.to_string())));
            });
        if let Err(err) = started {
            let _ = answer.send((subject, Err(format!("cannot start a thread: {err}"))));
        }
        answered
    }
}

/// Repositories a search lists.
const SHOWN: usize = 20;

/// Moves an arrived answer from `waiting` into `into`.
fn take<T>(waiting: &mut Option<Receiver<T>>, into: &mut Option<T>) {
    if let Some(receiver) = waiting {
        match receiver.try_recv() {
            Ok(answer) => {
                *into = Some(answer);
                *waiting = None;
            }
            Err(TryRecvError::Disconnected) => *waiting = None,
            Err(TryRecvError::Empty) => {}
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::hub::{HubCache, Retries, Timeouts};

    /// A hub on a loopback port nothing listens on: the answer is the error, naming the URL,
    /// and the window was never held up.
    /// A hub on a loopback port nothing listens on, tried once, with its cache in `cache`:
    /// every question to it fails at once, naming the URL.
    pub fn unreachable_hub(cache: &std::path::Path) -> HubOptions {
        HubOptions {
            endpoint: "http://127.0.0.1:9".into(),
            cache: HubCache::new(cache),
            revision: "main".into(),
            timeouts: Timeouts {
                connect: Duration::from_secs(2),
                read: Duration::from_secs(2),
            },
            retries: Retries {
                attempts: 1,
                first_wait: Duration::from_millis(1),
            },
        }
    }

    #[test]
    fn an_unreachable_hub_answers_with_the_reason() {
        let cache = tempfile::tempdir().unwrap();
        let mut search = HubSearch::new(Some(unreachable_hub(cache.path())));
        search.search("smollm".into());
        assert!(search.busy() && search.searching());
        let started = Instant::now();
        while search.busy() && started.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(10));
            search.poll();
        }
        let (query, answer) = search.found().expect("an answer");
        assert_eq!(query, "smollm");
        let reason = answer.as_ref().unwrap_err();
        assert!(reason.contains("127.0.0.1:9"), "{reason}");
    }

    #[test]
    fn without_a_cache_folder_the_answer_says_so() {
        let mut search = HubSearch::new(None);
        search.list_files("org/name".into());
        search.poll();
        let (id, answer) = search.files().expect("an answer");
        assert_eq!(id, "org/name");
        assert!(answer.is_err());
        assert!(!search.busy());
    }
}
