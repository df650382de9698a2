//! SHA-256 of files and the verification of checkpoint manifests.

use protocol::checkpoint::{CheckpointManifest, MANIFEST_FILE};
use protocol::report::CheckpointRecord;
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::Read;
use std::path::Path;

/// SHA-256 (lower-case hex) and size of a file, read once.
pub fn sha256_file(path: &Path) -> std::io::Result<(String, u64)> {
    let mut file = File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        total += n as u64;
    }
    let digest = hasher.finalize();
    let hex = digest.iter().map(|b| format!("{b:02x}")).collect();
    Ok((hex, total))
}

/// Reads `dir/manifest.json` and checks every file it lists (size, then SHA-256).
///
/// Returns `Ok(None)` when the directory has no manifest; `Err` with a sentence for the user
/// when the manifest is unreadable or a file is missing, truncated or altered.
pub fn verify_manifest_dir(dir: &Path) -> Result<Option<Vec<CheckpointRecord>>, String> {
    let manifest_path = dir.join(MANIFEST_FILE);
    let text = match std::fs::read_to_string(&manifest_path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read {}: {e}", manifest_path.display())),
    };
    let manifest: CheckpointManifest = serde_json::from_str(&text)
        .map_err(|e| format!("{} is not a valid manifest: {e}", manifest_path.display()))?;
    let mut records = Vec::with_capacity(manifest.files.len() + 1);
    for entry in &manifest.files {
        let path = dir.join(&entry.path);
        let meta = std::fs::metadata(&path)
            .map_err(|e| format!("checkpoint file {} is missing: {e}", path.display()))?;
        if meta.len() != entry.bytes {
            return Err(format!(
                "checkpoint file {} is {} bytes, the manifest says {}: it is truncated or was overwritten",
                path.display(),
                meta.len(),
                entry.bytes
            ));
        }
        let (sha, _) = sha256_file(&path)
            .map_err(|e| format!("cannot read checkpoint file {}: {e}", path.display()))?;
        if sha != entry.sha256 {
            return Err(format!(
                "checkpoint file {} does not match its manifest checksum (sha256 {sha}, expected {}): it is corrupted",
                path.display(),
                entry.sha256
            ));
        }
        records.push(CheckpointRecord {
            path: path.display().to_string(),
            bytes: entry.bytes,
            sha256: entry.sha256.clone(),
        });
    }
    Ok(Some(records))
}
