//! The server-sent-event frames of the live runs' latest events, encoded once for every page
//! that streams them.

use std::rc::Rc;

/// Event `seq`'s `data:` frame (its `id:` line, where it has one, is added before it).
fn piece(seq: u64, event: &protocol::daemon::RunEvent) -> Vec<u8> {
    let mut out = Vec::with_capacity(160);
    out.extend_from_slice(b"data: {\"seq\":");
    out.extend_from_slice(seq.to_string().as_bytes());
    out.extend_from_slice(b",\"event\":");
    if serde_json::to_writer(&mut out, event).is_err() {
        out.extend_from_slice(b"null");
    }
    out.extend_from_slice(b"}\n\n");
    out
}

/// One run's latest frames, by sequence number, oldest first.
type Ring = std::collections::VecDeque<(u64, Rc<[u8]>)>;

/// The server-sent-event frames (`data:` lines) of each run's latest events, encoded once for
/// all the pages that stream them: at most [`Frames::KEPT`] per run, and only for runs not finished.
#[derive(Default)]
pub struct Frames {
    runs: std::cell::RefCell<std::collections::HashMap<String, Ring>>,
}

impl Frames {
    /// Frames kept per run.
    pub const KEPT: usize = 4096;

    /// The `data:` frame of run `id`'s event `seq`, encoded now unless its feed or a page's
    /// stream just did.
    pub fn get(&self, id: &str, seq: u64, event: &protocol::daemon::RunEvent) -> Rc<[u8]> {
        let mut runs = self.runs.borrow_mut();
        // Looked up before inserting: a page's stream asks once per event, and a key made
        // for every lookup was an allocation each.
        if !runs.contains_key(id) {
            runs.insert(id.to_string(), Ring::default());
        }
        let Some(ring) = runs.get_mut(id) else {
            return Rc::from(Vec::new());
        };
        if let Some(&(first, _)) = ring.front() {
            if let Some((_, frame)) = seq.checked_sub(first).and_then(|i| ring.get(i as usize)) {
                return frame.clone();
            }
        }
        let frame: Rc<[u8]> = piece(seq, event).into();
        // Kept only when it extends the ring (the live edge), so the ring stays in order.
        let extends = ring.back().is_none_or(|&(last, _)| seq == last + 1);
        if extends {
            if ring.len() == Self::KEPT {
                ring.pop_front();
            }
            ring.push_back((seq, frame.clone()));
        } else if ring.back().is_some_and(|&(last, _)| seq > last + 1) {
            ring.clear();
            ring.push_back((seq, frame.clone()));
        }
        frame
    }

    /// Run `id` has ended: its frames go.
    pub fn forget(&self, id: &str) {
        self.runs.borrow_mut().remove(id);
    }

    /// Keeps the frames of the runs `live` says yes to (the others have ended).
    pub fn retain(&self, live: impl Fn(&str) -> bool) {
        self.runs.borrow_mut().retain(|id, _| live(id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_is_encoded_once_and_the_same_for_every_stream() {
        let frames = Frames::default();
        let event = |text: &str| protocol::daemon::RunEvent {
            t_ms: 7,
            kind: protocol::daemon::RunEventKind::Note { text: text.into() },
        };
        let a = frames.get("r", 5, &event("five"));
        let again = frames.get("r", 5, &event("five"));
        assert!(
            Rc::ptr_eq(&a, &again),
            "the second stream reuses the first's frame"
        );
        let text = String::from_utf8(a.to_vec()).unwrap();
        let data = text.lines().next().unwrap().strip_prefix("data: ").unwrap();
        assert!(
            text.starts_with("data: ") && text.ends_with("}\n\n"),
            "{text}"
        );
        let data: serde_json::Value = serde_json::from_str(data).unwrap();
        assert_eq!(data["seq"], 5);
        assert_eq!(data["event"]["text"], "five");
        // An older event than the ring holds is encoded, not kept; a jump restarts the ring.
        frames.get("r", 6, &event("six"));
        let one = frames.get("r", 1, &event("one"));
        assert!(!Rc::ptr_eq(&one, &frames.get("r", 1, &event("one"))));
        let far = frames.get("r", 100, &event("hundred"));
        assert!(Rc::ptr_eq(&far, &frames.get("r", 100, &event("hundred"))));
        frames.retain(|_| false);
        let after = frames.get("r", 100, &event("hundred"));
        assert!(!Rc::ptr_eq(&far, &after), "a finished run's frames go");
    }
}
