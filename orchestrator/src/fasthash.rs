//! A cheap hasher for the run loop's own tables: stage indices, PIDs and variable names, hashed
//! several times per stage. The standard `HashMap`'s SipHash resists keys chosen to collide,
//! which none of these tables needs (their keys are the plan's and the orchestrator's own), and
//! costs tens of nanoseconds a key; this is the multiply-and-rotate hash of the Rust compiler's
//! own tables (`FxHash`), a few cycles per word.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// A `HashMap` hashed with [`FxHasher`].
pub(crate) type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

/// A `HashSet` hashed with [`FxHasher`].
pub(crate) type FastSet<T> = HashSet<T, BuildHasherDefault<FxHasher>>;

/// The multiply-and-rotate hash (`FxHash`), one 64-bit word at a time.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct FxHasher {
    hash: u64,
}

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FxHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(word));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_i32(&mut self, i: i32) {
        self.add(u64::from(i as u32));
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        // The table takes its control bits from the top of the hash and its index from the
        // bottom: mix the product's high bits down so small integer keys spread over both.
        self.hash.rotate_left(26)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_and_sets_keep_what_they_are_given() {
        let mut set: FastSet<usize> = FastSet::default();
        for i in 0..10_000 {
            assert!(set.insert(i));
        }
        assert!(set.contains(&9_999) && !set.contains(&10_000));
        assert!(set.remove(&0) && !set.remove(&0));
        let mut map: FastMap<String, usize> = FastMap::default();
        for (n, key) in [
            "PATH",
            "HOME",
            "ORCHESTRATE_STAGE",
            "",
            "A_LONGER_NAME_THAN_8",
        ]
        .into_iter()
        .enumerate()
        {
            map.insert(key.to_string(), n);
        }
        assert_eq!(map.get("ORCHESTRATE_STAGE"), Some(&2));
        assert_eq!(map.get(""), Some(&3));
        assert_eq!(map.get("PATH"), Some(&0));
        assert_eq!(map.get("PAT"), None);
    }

    #[test]
    fn strings_that_differ_only_in_their_tail_hash_apart() {
        use std::hash::BuildHasher;
        let build = BuildHasherDefault::<FxHasher>::default();
        assert_ne!(build.hash_one("ABCDEFGHI"), build.hash_one("ABCDEFGHJ"));
        assert_ne!(build.hash_one(1usize), build.hash_one(2usize));
    }
}
