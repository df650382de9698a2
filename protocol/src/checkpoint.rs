//! The manifest that makes a stage's output directory verifiable.
//!
//! A writer puts its files in place first (temp file, fsync, rename), then writes
//! `manifest.json` the same way; a reader that finds the manifest may trust that every file it
//! lists was complete when listed, and checks sizes and checksums before use.
//!
//! Checksums name their algorithm ([`Checksum`]): manifests of version 1 hold SHA-256 only;
//! version 2 ([`MANIFEST_VERSION`]) holds BLAKE3 or SHA-256 per file. Readers take both.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// File name of the manifest inside an output directory.
pub const MANIFEST_FILE: &str = "manifest.json";

/// The manifest version written now: 2, where each file's checksum is named for its algorithm
/// (`"blake3"` or `"sha256"`). Version 1 listed a `"sha256"` for every file; such a manifest
/// is still read, and is also a valid version 2 manifest's shape.
pub const MANIFEST_VERSION: u32 = 2;

/// The manifest versions a reader of this crate understands.
pub const MANIFEST_VERSIONS_READ: std::ops::RangeInclusive<u32> = 1..=MANIFEST_VERSION;

/// What a checkpoint directory holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CheckpointManifest {
    /// Manifest version ([`MANIFEST_VERSION`]; 1 for manifests written before checksums named
    /// their algorithm).
    pub v: u32,
    /// The files, relative to the directory, with sizes and checksums.
    pub files: Vec<ManifestFile>,
    /// Training step the weights are from.
    #[serde(default)]
    pub step: Option<u64>,
    /// Model shape and anything else a loader needs (free-form JSON).
    #[serde(default)]
    pub model: serde_json::Value,
}

/// One file of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ManifestFile {
    /// Path relative to the checkpoint directory.
    pub path: String,
    /// Size in bytes.
    pub bytes: u64,
    /// Its checksum, written as `"blake3": "<hex>"` or `"sha256": "<hex>"`.
    #[serde(flatten)]
    pub checksum: Checksum,
}

/// A checksum algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// SHA-256: every version 1 manifest, and what the Python client reports.
    Sha256,
    /// BLAKE3 (32-byte output): what `stage-worker` and `orchestrate` compute since manifest
    /// version 2. Chosen because it hashes several GB/s on one core (SIMD over independent
    /// chunks), so a checkpoint's checksum keeps up with the disk it is written to, where
    /// SHA-256 (about 1.2 GB/s on the H200 host, with the CPU's SHA extensions) did not.
    Blake3,
}

impl Algorithm {
    /// What `stage-worker` and `orchestrate` compute for files they hash.
    pub const PREFERRED: Algorithm = Algorithm::Blake3;

    /// Its name, as the key a checksum is written under.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Sha256 => "sha256",
            Algorithm::Blake3 => "blake3",
        }
    }
}

/// A file's checksum under a named algorithm, lower-case hex (see [`hex`]). In JSON it is one
/// key, the algorithm's name: `"blake3": "…"` or `"sha256": "…"`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Checksum {
    /// SHA-256.
    Sha256(String),
    /// BLAKE3, 32-byte output.
    Blake3(String),
}

impl Checksum {
    /// The checksum of `bytes` under `algorithm`.
    pub fn of(algorithm: Algorithm, bytes: &[u8]) -> Checksum {
        let mut hasher = Hasher::new(algorithm);
        hasher.update(bytes);
        hasher.finalize()
    }

    /// The checksum a `checkpoint` event reports in its `sha256` and `blake3` fields: BLAKE3
    /// when given, else SHA-256, else none.
    pub fn from_event(sha256: Option<String>, blake3: Option<String>) -> Option<Checksum> {
        blake3
            .map(Checksum::Blake3)
            .or(sha256.map(Checksum::Sha256))
    }

    /// The `sha256` and `blake3` fields of a `checkpoint` event that reports this checksum
    /// (the inverse of [`Checksum::from_event`]).
    pub fn into_event(self) -> (Option<String>, Option<String>) {
        match self {
            Checksum::Sha256(h) => (Some(h), None),
            Checksum::Blake3(h) => (None, Some(h)),
        }
    }

    /// Its algorithm.
    pub fn algorithm(&self) -> Algorithm {
        match self {
            Checksum::Sha256(_) => Algorithm::Sha256,
            Checksum::Blake3(_) => Algorithm::Blake3,
        }
    }

    /// Its digest, hex as written.
    pub fn hex(&self) -> &str {
        match self {
            Checksum::Sha256(h) | Checksum::Blake3(h) => h,
        }
    }

    /// Whether `other` is the same digest under the same algorithm (hex compared without
    /// regard to case, for writers outside this project).
    pub fn matches(&self, other: &Checksum) -> bool {
        self.algorithm() == other.algorithm() && self.hex().eq_ignore_ascii_case(other.hex())
    }
}

impl std::fmt::Display for Checksum {
    /// `blake3 <hex>` or `sha256 <hex>`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.algorithm().name(), self.hex())
    }
}

/// An incremental checksum under one [`Algorithm`]: feed it a file's bytes in order, in pieces
/// of any size, and [`Hasher::finalize`] gives the same [`Checksum`] as [`Checksum::of`] the
/// whole.
pub struct Hasher(HasherState);

enum HasherState {
    Sha256(sha2::Sha256),
    Blake3(Box<blake3::Hasher>),
}

impl Hasher {
    /// A hasher that has seen nothing.
    pub fn new(algorithm: Algorithm) -> Hasher {
        Hasher(match algorithm {
            Algorithm::Sha256 => HasherState::Sha256(<sha2::Sha256 as sha2::Digest>::new()),
            Algorithm::Blake3 => HasherState::Blake3(Box::new(blake3::Hasher::new())),
        })
    }

    /// Feeds it the next bytes.
    pub fn update(&mut self, bytes: &[u8]) {
        match &mut self.0 {
            HasherState::Sha256(h) => sha2::Digest::update(h, bytes),
            HasherState::Blake3(h) => {
                h.update(bytes);
            }
        }
    }

    /// The checksum of everything fed.
    pub fn finalize(self) -> Checksum {
        match self.0 {
            HasherState::Sha256(h) => Checksum::Sha256(hex(&sha2::Digest::finalize(h))),
            HasherState::Blake3(h) => Checksum::Blake3(hex(h.finalize().as_bytes())),
        }
    }
}

/// `bytes` as lower-case hex, two digits a byte: how every checksum in a manifest, a worker's
/// events, the journal and the report is written, so checksums from any writer compare equal
/// as strings.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    out
}

/// Which file on disk a writer produced: enough to tell, without reading it, that a file is
/// still the very one whose checksum the writer computed while writing it.
///
/// A reader that finds a file with the same device, inode, size and modification time as a
/// writer reported may take the writer's checksum for it; anything else (a rewrite, a copy, a
/// truncation) changes at least one of them. Corruption that keeps all four (a bit flipped on
/// disk, an edit that restores the time) is caught by a full re-hash, which resume and every
/// built-in stage that reads the checkpoint still do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct FileIdentity {
    /// `st_dev` of the file system holding it.
    pub dev: u64,
    /// `st_ino`.
    pub ino: u64,
    /// Modification time, nanoseconds since the Unix epoch.
    pub mtime_ns: i64,
}

impl FileIdentity {
    /// The identity of the file `meta` describes; writer and reader call this same function,
    /// so the two agree field for field.
    pub fn of(meta: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        FileIdentity {
            dev: meta.dev(),
            ino: meta.ino(),
            mtime_ns: meta.mtime() * 1_000_000_000 + meta.mtime_nsec(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksums_of_known_inputs() {
        // FIPS 180-2's "abc", and BLAKE3's published digest of the empty input.
        assert_eq!(
            Checksum::of(Algorithm::Sha256, b"abc").hex(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            Checksum::of(Algorithm::Blake3, b"").hex(),
            "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
        );
    }

    #[test]
    fn a_hasher_fed_in_pieces_agrees_with_the_whole() {
        let bytes: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
        for algorithm in [Algorithm::Sha256, Algorithm::Blake3] {
            let mut h = Hasher::new(algorithm);
            for piece in bytes.chunks(4099) {
                h.update(piece);
            }
            assert_eq!(h.finalize(), Checksum::of(algorithm, &bytes));
        }
    }

    #[test]
    fn a_checksum_is_one_key_named_for_its_algorithm() {
        let file = ManifestFile {
            path: "w.bin".into(),
            bytes: 3,
            checksum: Checksum::Blake3("ab".into()),
        };
        let json = serde_json::to_value(&file).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"path": "w.bin", "bytes": 3, "blake3": "ab"})
        );
        assert_eq!(serde_json::from_value::<ManifestFile>(json).unwrap(), file);
        // A version 1 entry reads as SHA-256.
        let old: ManifestFile =
            serde_json::from_str(r#"{"path":"w.bin","bytes":3,"sha256":"CD"}"#).unwrap();
        assert_eq!(old.checksum, Checksum::Sha256("CD".into()));
        assert!(old.checksum.matches(&Checksum::Sha256("cd".into())));
        assert!(!old.checksum.matches(&Checksum::Blake3("cd".into())));
        // The key is the algorithm's name, as `Display` and messages write it.
        for c in [Checksum::Sha256("a".into()), Checksum::Blake3("b".into())] {
            let json = serde_json::to_value(&c).unwrap();
            assert!(json.get(c.algorithm().name()).is_some(), "{json}");
        }
        // An event carries it in the field of its algorithm, and reads it back.
        for c in [Checksum::Sha256("a".into()), Checksum::Blake3("b".into())] {
            let (sha256, blake3) = c.clone().into_event();
            assert_eq!(Checksum::from_event(sha256, blake3), Some(c));
        }
        // No checksum at all is not an entry.
        assert!(serde_json::from_str::<ManifestFile>(r#"{"path":"w.bin","bytes":3}"#).is_err());
    }

    #[test]
    fn hex_is_lower_case_two_digits_a_byte() {
        assert_eq!(hex(&[0x00, 0x0f, 0xa0, 0xff]), "000fa0ff");
        assert_eq!(hex(&[]), "");
    }
}
