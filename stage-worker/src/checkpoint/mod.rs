//! Checkpoints: `model.safetensors`, `optimizer.safetensors` and, written last,
//! `manifest.json` listing both with sizes and checksums (BLAKE3).
//!
//! Writing: the old manifest is removed first, then each file is put in place atomically, then
//! the new manifest; so a directory with a manifest always holds exactly the files it lists.
//! A training checkpoint ([`write()`] for the byte-level model, [`write_streamed`] for either)
//! puts its files and its manifest in place before it fsyncs them, so that a downstream stage
//! started early reads them from the page cache while the disk catches up; the stage's end (and so any use of the checkpoint by a stage that did
//! not start early) is recorded only after the fsyncs. After a power loss in between, the
//! manifest may list bytes that never reached the disk; every reader checks each file's size
//! and checksum against the manifest, so such a checkpoint is refused, never used (a retried
//! stage then starts afresh instead of resuming from it).
//! Reading: every listed file is read once, its size and checksum checked against the manifest,
//! and tensors are parsed from those same verified bytes.
//! A Llama model's checkpoint is also a Hugging Face directory, which transformers loads
//! ([`hf`]: `config.json` and the tokenizer's files beside the weights under transformers'
//! names); its starting weights are read from one.

pub mod fileread;
pub mod fsio;
pub mod hf;
pub mod input_wait;
pub mod stream;
pub mod writeback;

use crate::checkpoint::fsio::{
    checksum, fsync_dir, publish, remove_durably, write_atomic, WrittenFile,
};
use crate::checkpoint::stream::{FileSpec, HeaderEntry, Run};
use crate::device::Released;
use crate::failure::{Failure, StageResult};
use crate::model::optim::AdamW;
use crate::model::{config_from_manifest, manifest_model, ByteGpt};
use protocol::checkpoint::{
    CheckpointManifest, Checksum, FileIdentity, ManifestFile, MANIFEST_FILE, MANIFEST_VERSION,
    MANIFEST_VERSIONS_READ,
};
use protocol::worker::{ModelConfig, StageSpec};
use safetensors::tensor::SafeTensors;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tch::Tensor;

/// The weights (fp32, named as in [`crate::model`]).
pub const MODEL_FILE: &str = "model.safetensors";
/// The AdamW moments and step (see [`crate::model::optim`]).
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";

/// How far the training that wrote a checkpoint got; stored in the manifest's
/// `model.training`, it lets a retried stage resume its own interrupted run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrainingState {
    /// Whether every planned step was taken.
    pub complete: bool,
    /// Steps the stage planned.
    pub total_steps: u64,
    /// The `data` parameter it trained on.
    pub data: String,
    /// The seed it trained with.
    pub seed: u64,
}

/// What a training's final metrics are computed from besides its weights, kept in each of its
/// checkpoints (the manifest's `model.losses`): a stage resumed from one reports the
/// `first_loss` and `final_loss` an uninterrupted training would (see `train`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LossHistory {
    /// The loss of the training's first step.
    #[serde(default)]
    pub first_loss: Option<f64>,
    /// The losses of its last steps, oldest first (as many as `final_loss` averages, or fewer).
    #[serde(default)]
    pub recent: Vec<f64>,
}

/// Parses safetensors bytes into named CPU tensors; `what` names the source in errors.
pub fn decode_tensors(bytes: &[u8], what: &str) -> Result<Vec<(String, Tensor)>, String> {
    let st = SafeTensors::deserialize(bytes)
        .map_err(|e| format!("{what} is not a valid safetensors file: {e:?}"))?;
    let mut out = Vec::new();
    for (name, view) in st.tensors() {
        let t = Tensor::try_from(view).map_err(|e| format!("{what}: tensor `{name}`: {e}"))?;
        out.push((name, t));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

fn io_failure(path: &Path, e: std::io::Error) -> Failure {
    Failure::other(format!("cannot write {}: {e}", path.display()))
}

/// Writes `files` (name, bytes) into `dir` (created if needed), each atomically, then a
/// manifest listing them with `step` and `model`; an old manifest is removed first, so a
/// manifest only ever lists complete files. Returns the manifest and every file written,
/// the manifest last.
pub fn write_with_manifest(
    dir: &Path,
    files: Vec<(&str, Vec<u8>)>,
    step: Option<u64>,
    model: serde_json::Value,
) -> StageResult<(CheckpointManifest, Vec<WrittenFile>)> {
    std::fs::create_dir_all(dir).map_err(|e| io_failure(dir, e))?;
    remove_durably(dir, MANIFEST_FILE).map_err(|e| io_failure(&dir.join(MANIFEST_FILE), e))?;
    let mut written = Vec::new();
    for (name, bytes) in files {
        written.push(write_listed(dir, name, &bytes)?);
    }
    let manifest = CheckpointManifest {
        v: MANIFEST_VERSION,
        files: written.iter().map(|w| w.entry.clone()).collect(),
        step,
        model,
    };
    let mut text = serde_json::to_vec_pretty(&manifest).expect("manifest serializes");
    text.push(b'\n');
    written.push(write_listed(dir, MANIFEST_FILE, &text)?);
    Ok((manifest, written))
}

/// Writes one file atomically and describes it as a manifest entry.
fn write_listed(dir: &Path, name: &str, bytes: &[u8]) -> StageResult<WrittenFile> {
    let path = dir.join(name);
    write_atomic(dir, name, bytes).map_err(|e| io_failure(&path, e))?;
    let identity = std::fs::metadata(&path).ok().map(|m| identity_of(&m));
    Ok(WrittenFile {
        path,
        entry: ManifestFile {
            path: name.to_string(),
            bytes: bytes.len() as u64,
            checksum: checksum(bytes),
        },
        identity,
        phases: Vec::new(),
    })
}

/// The identity of a file from its metadata.
pub fn identity_of(meta: &std::fs::Metadata) -> FileIdentity {
    FileIdentity::of(meta)
}

/// Header entries of the slices of a flat buffer, names prefixed, in buffer order.
fn flat_entries(params: &crate::model::params::ParamStore, prefix: &str) -> Vec<HeaderEntry> {
    params
        .params
        .iter()
        .map(|p| HeaderEntry {
            name: format!("{prefix}{}", p.name),
            dtype: "F32",
            shape: p.shape.clone(),
            bytes: p.numel as usize * 4,
        })
        .collect()
}

/// The two tensor files of a training checkpoint of `params` and `opt`, each streamed from
/// its flat buffers in one pass (see [`crate::checkpoint::stream`]), with `metadata` as their
/// headers' `__metadata__` when given.
///
/// Layout: in `model.safetensors` the parameters follow each other in buffer order, so its
/// data is [`crate::model::params::ParamStore::flat`] verbatim; `optimizer.safetensors` holds the
/// step (int64) and then both moments in the same order.
pub fn tensor_files(
    params: &crate::model::params::ParamStore,
    opt: &AdamW,
    metadata: Option<&serde_json::Value>,
) -> Vec<FileSpec> {
    let total = params.numel();
    let model_file = FileSpec {
        name: MODEL_FILE.into(),
        runs: vec![
            Run::Bytes(stream::header(&flat_entries(params, ""), metadata)),
            Run::Floats {
                tensor: params.flat.shallow_clone(),
                offset: 0,
                numel: total,
            },
        ],
    };
    let mut entries = vec![HeaderEntry {
        name: crate::model::optim::STEP_TENSOR.into(),
        dtype: "I64",
        shape: vec![1],
        bytes: 8,
    }];
    entries.extend(flat_entries(params, crate::model::optim::EXP_AVG));
    entries.extend(flat_entries(params, crate::model::optim::EXP_AVG_SQ));
    let mut head = stream::header(&entries, metadata);
    head.extend_from_slice(&(opt.step as i64).to_le_bytes());
    let optimizer_file = FileSpec {
        name: OPTIMIZER_FILE.into(),
        runs: vec![
            Run::Bytes(head),
            Run::Floats {
                tensor: opt.exp_avg.shallow_clone(),
                offset: 0,
                numel: total,
            },
            Run::Floats {
                tensor: opt.exp_avg_sq.shallow_clone(),
                offset: 0,
                numel: total,
            },
        ],
    };
    vec![model_file, optimizer_file]
}

/// Writes a complete checkpoint of the byte-level `model` and `opt` at `step` into `dir`: its
/// [`tensor_files`] through [`write_streamed`] (so with the same promises and the same
/// release), its manifest recording the model's shape, `training` and `losses`.
pub fn write(
    dir: &Path,
    model: &ByteGpt,
    opt: &AdamW,
    step: u64,
    training: &TrainingState,
    losses: &LossHistory,
    released: Option<&mut Option<Released>>,
) -> StageResult<(CheckpointManifest, Vec<WrittenFile>)> {
    let mut model_json = manifest_model(&model.config);
    model_json.insert(
        "training".into(),
        serde_json::to_value(training).expect("training state serializes"),
    );
    model_json.insert(
        "losses".into(),
        serde_json::to_value(losses).expect("loss history serializes"),
    );
    let tensors = tensor_files(&model.params, opt, None);
    let model_json = serde_json::Value::Object(model_json);
    write_streamed(dir, Vec::new(), tensors, step, model_json, released)
}

/// Writes a checkpoint at `step` into `dir` (created if needed): first the small files `ahead`
/// (put in place before any tensor data is copied, so that a reader who sees the release sees
/// them), then the `tensors` files (in parallel, each in one pass), then the manifest listing
/// them all with `step` and `model`. As with [`write_with_manifest`], the old manifest is
/// removed first. Every file, the manifest included, is in place before any is fsynced (see
/// the module's documentation); it returns once all are durable, the manifest last in the list.
///
/// With `released` given, the process's CUDA context is destroyed as soon as every byte has
/// been copied to the host, while the disk finishes (see [`crate::device::release`]), and
/// what was done is recorded there, also when the write then fails: once it holds a
/// [`Released`], the caller must make no further device call, not even dropping a device
/// tensor.
pub fn write_streamed(
    dir: &Path,
    ahead: Vec<FileSpec>,
    tensors: Vec<FileSpec>,
    step: u64,
    model: serde_json::Value,
    released: Option<&mut Option<Released>>,
) -> StageResult<(CheckpointManifest, Vec<WrittenFile>)> {
    std::fs::create_dir_all(dir).map_err(|e| io_failure(dir, e))?;
    remove_durably(dir, MANIFEST_FILE).map_err(|e| io_failure(&dir.join(MANIFEST_FILE), e))?;
    let first = stream::write_files_unsynced(dir, ahead, None).map_err(|e| io_failure(dir, e))?;
    // The release runs on a thread of its own, so that the copier that calls it goes on at
    // once; it is waited for before returning.
    let releasing = std::sync::Mutex::new(None);
    let release = || {
        let handle = std::thread::spawn(|| {
            let done = crate::device::release();
            if done.is_some() {
                crate::events::EventSink::announce_released();
                crate::device::simulated_persist_delay();
            }
            done
        });
        *releasing.lock().unwrap_or_else(|e| e.into_inner()) = Some(handle);
    };
    let after_copies: Option<&(dyn Fn() + Sync)> = if released.is_some() {
        Some(&release)
    } else {
        None
    };
    let unsynced = tch::no_grad(|| stream::write_files_unsynced(dir, tensors, after_copies))
        .map_err(|e| io_failure(dir, e));
    if let Some(h) = releasing.into_inner().unwrap_or_else(|e| e.into_inner()) {
        let done = h.join().ok().flatten();
        if let Some(slot) = released {
            *slot = done;
        }
    }
    let ahead_count = first.written().count();
    let unsynced = first.and(unsynced?);
    let manifest = CheckpointManifest {
        v: MANIFEST_VERSION,
        files: unsynced.written().map(|w| w.entry.clone()).collect(),
        step: Some(step),
        model,
    };
    let mut text = serde_json::to_vec_pretty(&manifest).expect("manifest serializes");
    text.push(b'\n');
    // Complete and checksummed: the manifest goes in place now (see the module's
    // documentation), then everything is made durable.
    let manifest_path = dir.join(MANIFEST_FILE);
    let manifest_file =
        publish(dir, MANIFEST_FILE, &text).map_err(|e| io_failure(&manifest_path, e))?;
    let mut written = unsynced.sync().map_err(|e| io_failure(dir, e))?;
    // Only the tensor files' phases tell how the checkpoint's time went (`t_copied_model` …).
    for w in &mut written[..ahead_count] {
        w.phases.clear();
    }
    manifest_file
        .sync_all()
        .and_then(|()| fsync_dir(dir))
        .map_err(|e| io_failure(&manifest_path, e))?;
    written.push(WrittenFile {
        identity: std::fs::metadata(&manifest_path)
            .ok()
            .map(|m| identity_of(&m)),
        entry: ManifestFile {
            path: MANIFEST_FILE.to_string(),
            bytes: text.len() as u64,
            checksum: checksum(&text),
        },
        path: manifest_path,
        phases: Vec::new(),
    });
    Ok((manifest, written))
}

/// A checkpoint whose listed files all matched their manifest entries when read.
pub struct Verified {
    /// The checkpoint directory.
    pub dir: PathBuf,
    /// Its manifest.
    pub manifest: CheckpointManifest,
    contents: BTreeMap<String, Arc<Vec<u8>>>,
    /// Checksums still being computed ([`open_init`]), then their verdict.
    pending: Mutex<Pending>,
    /// Whether `model.safetensors` was read before the manifest appeared ([`open_init`]).
    read_early: bool,
}

#[derive(Default)]
struct Pending {
    running: Vec<std::thread::JoinHandle<StageResult<()>>>,
    failed: Option<Failure>,
}

/// The model shape recorded in the manifest in `dir` (the manifest alone is read; nothing is
/// verified).
pub fn peek_model_config(dir: &Path) -> Result<ModelConfig, String> {
    let text = std::fs::read(dir.join(MANIFEST_FILE)).map_err(|e| e.to_string())?;
    let manifest: CheckpointManifest = serde_json::from_slice(&text).map_err(|e| e.to_string())?;
    config_from_manifest(&manifest.model)
}

/// Whether a checkpoint directory has a manifest at all.
pub fn exists(dir: &Path) -> bool {
    dir.join(MANIFEST_FILE).is_file()
}

/// Reads the checkpoint in `dir` and verifies every file its manifest lists (size, then
/// checksum) before anything is parsed. Every refusal is a bad-input failure naming the file
/// and what is wrong with it.
pub fn open_verified(dir: &Path) -> StageResult<Verified> {
    open_checked(dir, None, false, None)
}

/// Like [`open_verified`] for a stage that only needs the weights (an `init` checkpoint):
/// every listed file must be present with its listed size, and `model.safetensors` is read and
/// its checksum checked; the optimizer state, which such a stage never uses, is not read.
pub fn open_for_weights(dir: &Path) -> StageResult<Verified> {
    open_checked(dir, Some(&[MODEL_FILE]), false, None)
}

/// Opens a stage's `init` checkpoint in `dir` for its weights: like [`open_for_weights`], but
/// the checksum of `model.safetensors` is computed on a thread of its own while the stage goes
/// on (building the model, loading these weights, training): hashing a large checkpoint takes
/// longer than everything else before the first step. The caller must call
/// [`Verified::finish`] before it writes or reports anything derived from the weights; until
/// then they are unverified. Sizes are checked at once.
///
/// If `spec` says the checkpoint's stage may still be writing it (an early start, see
/// [`crate::checkpoint::input_wait`]), its manifest is waited for first, and meanwhile `model.safetensors`
/// is read as soon as it is in place (its writer puts each file in place whole, by rename,
/// before the manifest). Those bytes are used only if the file at that path once the manifest
/// is there is the very file that was read (the same identity, and it was held open all along,
/// so its inode cannot have been reused); otherwise the file is read again. Returns how long
/// the manifest was waited for and when it was seen.
pub fn open_init(spec: &StageSpec, dir: &Path) -> StageResult<(Verified, Duration, Instant)> {
    let model = dir.join(MODEL_FILE);
    let mut early: Option<EarlyRead> = None;
    let waited = crate::checkpoint::input_wait::await_input_polling(spec, dir, || {
        // A file left by an earlier attempt may be there first: a read is (re)started for
        // each new file put in place (a `stat` per poll).
        let Ok(meta) = std::fs::metadata(&model) else {
            return;
        };
        if early
            .as_ref()
            .is_none_or(|e| e.identity != FileIdentity::of(&meta))
        {
            early = EarlyRead::start(&model);
        }
    })?;
    let complete = Instant::now();
    let v = open_checked(dir, Some(&[MODEL_FILE]), true, early)?;
    Ok((v, waited, complete))
}

/// A file being read on a thread of its own, held open, with the identity it had when opened.
struct EarlyRead {
    identity: FileIdentity,
    reading: std::thread::JoinHandle<(File, std::io::Result<Vec<u8>>)>,
}

impl EarlyRead {
    /// Starts reading the file at `path`, if there is one.
    fn start(path: &Path) -> Option<EarlyRead> {
        let file = File::open(path).ok()?;
        let identity = FileIdentity::of(&file.metadata().ok()?);
        let reading = std::thread::spawn(move || {
            let bytes = crate::checkpoint::fileread::read_file(&file);
            (file, bytes)
        });
        Some(EarlyRead { identity, reading })
    }

    /// The bytes read, if the file now at `path` is the one read and was read whole (true);
    /// else the file at `path` read now (false). Either way checked against `f`'s size.
    fn into_bytes(self, path: &Path, f: &ManifestFile) -> StageResult<(Vec<u8>, bool)> {
        if let Ok((file, Ok(bytes))) = self.reading.join() {
            let current = std::fs::metadata(path).ok().map(|m| FileIdentity::of(&m));
            // Held open until now, so that no other file could have taken its inode.
            drop(file);
            if current == Some(self.identity) {
                crate::log!("{} was read before its manifest appeared", path.display());
                check_size(path, bytes.len() as u64, f.bytes)?;
                return Ok((bytes, true));
            }
        }
        Ok((read_sized(path, f)?, false))
    }
}

fn open_checked(
    dir: &Path,
    only: Option<&[&str]>,
    deferred: bool,
    mut early: Option<EarlyRead>,
) -> StageResult<Verified> {
    let manifest_path = dir.join(MANIFEST_FILE);
    let text = std::fs::read(&manifest_path).map_err(|e| {
        Failure::bad_input(if e.kind() == std::io::ErrorKind::NotFound {
            format!(
                "no checkpoint in {}: {MANIFEST_FILE} is missing (the stage that writes it did not finish)",
                dir.display()
            )
        } else {
            format!("cannot read {}: {e}", manifest_path.display())
        })
    })?;
    let manifest: CheckpointManifest = serde_json::from_slice(&text).map_err(|e| {
        Failure::bad_input(format!(
            "{} is not a valid manifest: {e}",
            manifest_path.display()
        ))
    })?;
    if !MANIFEST_VERSIONS_READ.contains(&manifest.v) {
        return Err(Failure::bad_input(format!(
            "{} has format version {}, this stage-worker reads versions {}–{}; use the stage-worker that wrote it, or rewrite the checkpoint",
            manifest_path.display(),
            manifest.v,
            MANIFEST_VERSIONS_READ.start(),
            MANIFEST_VERSIONS_READ.end()
        )));
    }
    let mut to_read = Vec::new();
    for f in &manifest.files {
        let relative = Path::new(&f.path);
        let safe = !f.path.is_empty()
            && relative
                .components()
                .all(|c| matches!(c, Component::Normal(_)));
        if !safe {
            return Err(Failure::bad_input(format!(
                "{} lists `{}`, which is not a path inside the checkpoint directory",
                manifest_path.display(),
                f.path
            )));
        }
        let path = dir.join(relative);
        let meta = std::fs::metadata(&path).map_err(|e| {
            Failure::bad_input(if e.kind() == std::io::ErrorKind::NotFound {
                format!("checkpoint {} is missing", path.display())
            } else {
                format!("checkpoint {} cannot be read: {e}", path.display())
            })
        })?;
        check_size(&path, meta.len(), f.bytes)?;
        if only.is_none_or(|names| names.contains(&f.path.as_str())) {
            to_read.push((f, path));
        }
    }
    let mut contents = BTreeMap::new();
    let mut pending = Pending::default();
    let mut read_early = false;
    if deferred {
        for (f, path) in to_read {
            let early = if f.path == MODEL_FILE {
                early.take()
            } else {
                None
            };
            let bytes = Arc::new(match early {
                Some(e) => {
                    let (bytes, was_early) = e.into_bytes(&path, f)?;
                    read_early |= was_early;
                    bytes
                }
                None => read_sized(&path, f)?,
            });
            let name = f.path.clone();
            let (entry, shared) = (f.clone(), bytes.clone());
            pending.running.push(std::thread::spawn(move || {
                check_hash(&path, &entry, &shared)
            }));
            contents.insert(name, bytes);
        }
    } else {
        // Each file is read and hashed on its own thread.
        let read: Vec<StageResult<(String, Vec<u8>)>> = std::thread::scope(|s| {
            let handles: Vec<_> = to_read
                .iter()
                .map(|(f, path)| {
                    s.spawn(move || {
                        let bytes = read_sized(path, f)?;
                        check_hash(path, f, &bytes)?;
                        Ok((f.path.clone(), bytes))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(Failure::other("checkpoint reader panicked")))
                })
                .collect()
        });
        for r in read {
            let (name, bytes) = r?;
            contents.insert(name, Arc::new(bytes));
        }
    }
    Ok(Verified {
        dir: dir.to_path_buf(),
        manifest,
        contents,
        pending: Mutex::new(pending),
        read_early,
    })
}

fn check_size(path: &Path, len: u64, listed: u64) -> StageResult<()> {
    if len < listed {
        return Err(Failure::bad_input(format!(
            "checkpoint {} is truncated: {len} of {listed} bytes",
            path.display()
        )));
    }
    if len > listed {
        return Err(Failure::bad_input(format!(
            "checkpoint {} has {len} bytes, its manifest says {listed}",
            path.display()
        )));
    }
    Ok(())
}

/// Reads one listed file and checks its size.
fn read_sized(path: &Path, f: &ManifestFile) -> StageResult<Vec<u8>> {
    let bytes = crate::checkpoint::fileread::read_path(path).map_err(|e| {
        Failure::bad_input(if e.kind() == std::io::ErrorKind::NotFound {
            format!("checkpoint {} is missing", path.display())
        } else {
            format!("checkpoint {} cannot be read: {e}", path.display())
        })
    })?;
    check_size(path, bytes.len() as u64, f.bytes)?;
    Ok(bytes)
}

/// Checks a listed file's bytes against its checksum (under the manifest's algorithm for it).
fn check_hash(path: &Path, f: &ManifestFile, bytes: &[u8]) -> StageResult<()> {
    let actual = Checksum::of(f.checksum.algorithm(), bytes);
    if !actual.matches(&f.checksum) {
        return Err(Failure::bad_input(format!(
            "checkpoint {} is corrupted: its checksum is {actual}, its manifest says {}",
            path.display(),
            f.checksum
        )));
    }
    Ok(())
}

/// Copies a safetensors file's data into `params.flat` in one transfer when the file holds
/// exactly the parameters, as fp32, laid out in buffer order; false (nothing done) otherwise.
fn load_in_buffer_order(bytes: &[u8], params: &crate::model::params::ParamStore) -> bool {
    let Ok((header_len, metadata)) = SafeTensors::read_metadata(bytes) else {
        return false;
    };
    let infos = metadata.tensors();
    if infos.len() != params.params.len() {
        return false;
    }
    let in_order = params.params.iter().all(|p| {
        infos.get(&p.name).is_some_and(|info| {
            info.dtype == safetensors::Dtype::F32
                && info
                    .shape
                    .iter()
                    .map(|&d| d as i64)
                    .eq(p.shape.iter().copied())
                && info.data_offsets == (p.offset as usize * 4, (p.offset + p.numel) as usize * 4)
        })
    });
    let start = 8 + header_len;
    let total = params.numel() as usize;
    if !in_order || bytes.len() != start + total * 4 {
        return false;
    }
    let data = &bytes[start..];
    tch::no_grad(|| {
        // SAFETY: `data` holds `total` f32s and outlives `host`, dropped after the synchronous
        // copy below.
        let host = unsafe {
            Tensor::from_blob(
                data.as_ptr(),
                &[total as i64],
                &[1],
                tch::Kind::Float,
                tch::Device::Cpu,
            )
        };
        let mut flat = params.flat.shallow_clone();
        flat.copy_(&host);
    });
    true
}

impl Verified {
    /// Whether `model.safetensors` was read before its manifest appeared (see [`open_init`]).
    pub fn read_early(&self) -> bool {
        self.read_early
    }

    /// The model shape recorded in the manifest.
    pub fn model_config(&self) -> StageResult<ModelConfig> {
        config_from_manifest(&self.manifest.model)
            .map_err(|e| Failure::bad_input(format!("checkpoint {}: {e}", self.dir.display())))
    }

    /// The training state recorded in the manifest, if any.
    pub fn training(&self) -> Option<TrainingState> {
        let t = self.manifest.model.get("training")?;
        serde_json::from_value(t.clone()).ok()
    }

    /// The loss history recorded in the manifest (none in a checkpoint written before it was
    /// kept).
    pub fn losses(&self) -> Option<LossHistory> {
        let t = self.manifest.model.get("losses")?;
        serde_json::from_value(t.clone()).ok()
    }

    /// The named tensors of the listed, verified `file`.
    pub fn tensors(&self, file: &str) -> StageResult<Vec<(String, Tensor)>> {
        let what = self.dir.join(file).display().to_string();
        let bytes = self.contents.get(file).ok_or_else(|| {
            if self.manifest.files.iter().any(|f| f.path == file) {
                Failure::other(format!(
                    "checkpoint {}: {file} was not read (opened for its weights only)",
                    self.dir.display()
                ))
            } else {
                Failure::bad_input(format!(
                    "checkpoint {} has no {file} in its manifest",
                    self.dir.display()
                ))
            }
        })?;
        decode_tensors(bytes, &what).map_err(Failure::bad_input)
    }

    /// Waits for the checksums still being computed (see [`open_init`]) and
    /// says whether every file read matched its manifest. The same answer every time.
    pub fn finish(&self) -> StageResult<()> {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        for handle in std::mem::take(&mut pending.running) {
            let verdict = handle
                .join()
                .unwrap_or_else(|_| Err(Failure::other("checkpoint hashing panicked")));
            if let Err(e) = verdict {
                pending.failed.get_or_insert(e);
            }
        }
        match &pending.failed {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// Loads the weights into `model`, whose shape must match. A file written in buffer order
    /// (as [`write()`] does) is copied into the flat parameter buffer in one transfer; any other
    /// layout tensor by tensor. If the file cannot be loaded, a checksum mismatch found by
    /// [`Verified::finish`] is the error reported.
    pub fn load_model(&self, model: &ByteGpt) -> StageResult<()> {
        let what = self.dir.join(MODEL_FILE).display().to_string();
        let loaded = match self.contents.get(MODEL_FILE) {
            Some(bytes) if load_in_buffer_order(bytes, &model.params) => Ok(()),
            _ => self.tensors(MODEL_FILE).and_then(|tensors| {
                model
                    .params
                    .load(&tensors, &what)
                    .map_err(Failure::bad_input)
            }),
        };
        if loaded.is_err() {
            self.finish()?;
        }
        loaded
    }

    /// Loads the verified optimizer state into `opt`.
    pub fn load_optimizer(&self, model: &ByteGpt, opt: &mut AdamW) -> StageResult<()> {
        let what = self.dir.join(OPTIMIZER_FILE).display().to_string();
        let tensors = self.tensors(OPTIMIZER_FILE)?;
        opt.load(&model.params, &tensors, &what)
            .map_err(Failure::bad_input)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::failure::FailureKind;
    use tch::{Device, Kind};

    fn tiny() -> ModelConfig {
        ModelConfig {
            d_model: 16,
            n_layers: 1,
            n_heads: 2,
            max_seq_len: 8,
        }
    }

    fn trained() -> (ByteGpt, AdamW) {
        let mut model = ByteGpt::new(&tiny(), Device::Cpu, 11);
        let mut opt = AdamW::new(&model.params, 0.1);
        let ids = Tensor::from_slice(&[1i64, 2, 3, 4]).view([1, 4]);
        let tg = Tensor::from_slice(&[2i64, 3, 4, 5]).view([1, 4]);
        for _ in 0..2 {
            model.params.zero_grad();
            model.loss(&ids, &tg, Kind::Float).backward();
            let _ = opt.step(&mut model.params, 1e-2);
        }
        (model, opt)
    }

    fn state() -> TrainingState {
        TrainingState {
            complete: true,
            total_steps: 2,
            data: "synthetic:pretrain".into(),
            seed: 0,
        }
    }

    /// The checkpoint of `model` and `opt` at step 2 with [`state`] and no loss history, not final.
    fn write_at_step_2(
        dir: &Path,
        model: &ByteGpt,
        opt: &AdamW,
    ) -> StageResult<(CheckpointManifest, Vec<WrittenFile>)> {
        write(dir, model, opt, 2, &state(), &LossHistory::default(), None)
    }

    #[test]
    fn written_checkpoint_reads_back_bit_identical() {
        crate::testutil::one_torch_thread();
        let dir = crate::testutil::scratch_dir("ckpt-roundtrip");
        let (model, opt) = trained();
        let (manifest, files) = write_at_step_2(&dir, &model, &opt).unwrap();
        assert_eq!(manifest.step, Some(2));
        assert_eq!(files.len(), 3);
        for f in &files {
            let bytes = std::fs::read(&f.path).unwrap();
            assert_eq!(bytes.len() as u64, f.entry.bytes);
            assert_eq!(checksum(&bytes), f.entry.checksum);
        }

        let v = open_verified(&dir).unwrap();
        assert_eq!(v.model_config().unwrap(), tiny());
        assert_eq!(v.training(), Some(state()));
        let back = ByteGpt::new(&tiny(), Device::Cpu, 99);
        assert!(!back.params.flat.equal(&model.params.flat));
        v.load_model(&back).unwrap();
        assert!(back.params.flat.equal(&model.params.flat));
        let mut opt_back = AdamW::new(&back.params, 0.1);
        v.load_optimizer(&back, &mut opt_back).unwrap();
        assert_eq!(opt_back.step, 2);
        assert!(opt_back.exp_avg.equal(&opt.exp_avg));
        assert!(opt_back.exp_avg_sq.equal(&opt.exp_avg_sq));

        // Writing what was read gives the very same bytes.
        let dir2 = crate::testutil::scratch_dir("ckpt-rewrite");
        let (manifest2, _) = write(
            &dir2,
            &back,
            &opt_back,
            2,
            &state(),
            &LossHistory::default(),
            None,
        )
        .unwrap();
        assert_eq!(manifest2.files, manifest.files);
        for name in [MODEL_FILE, OPTIMIZER_FILE, MANIFEST_FILE] {
            assert_eq!(
                std::fs::read(dir.join(name)).unwrap(),
                std::fs::read(dir2.join(name)).unwrap(),
                "{name}"
            );
        }
    }

    #[test]
    fn a_failed_write_leaves_no_manifest_and_the_old_checkpoint_is_not_listed() {
        crate::testutil::one_torch_thread();
        let dir = crate::testutil::scratch_dir("ckpt-write-fails");
        let (model, opt) = trained();
        write_at_step_2(&dir, &model, &opt).unwrap();
        assert!(open_verified(&dir).is_ok());
        // Every write past the headers' first byte fails: no tensor data reaches either file.
        crate::checkpoint::stream::fail_writes_in(&dir, 1);
        let err = write(
            &dir,
            &model,
            &opt,
            3,
            &state(),
            &LossHistory::default(),
            None,
        )
        .err()
        .unwrap();
        assert!(
            err.message.contains("injected write error"),
            "{}",
            err.message
        );
        assert!(!dir.join(MANIFEST_FILE).exists());
        let err = open_verified(&dir).err().unwrap();
        assert_eq!(err.kind, FailureKind::BadInput);
        assert!(
            err.message.contains("manifest.json is missing"),
            "{}",
            err.message
        );
        let temporaries: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".tmp-"))
            .collect();
        assert!(temporaries.is_empty(), "{temporaries:?}");
    }

    /// A spec whose `init` is `dir`, marked as still being written.
    fn early_spec(dir: &Path) -> StageSpec {
        let mut spec: StageSpec = serde_json::from_str(
            r#"{"v":1,"stage":"s","kind":"train","params":{},"output_dir":"/o","inputs":{},"device":"cpu","attempt":1}"#,
        )
        .unwrap();
        spec.init = Some(dir.to_path_buf());
        spec.inputs_being_written.push(dir.to_path_buf());
        spec.input_wait_limit_s = Some(20.0);
        spec
    }

    /// Puts `src/name` in place in `dir` whole, as a writer does (temporary file, rename).
    fn put_in_place(src: &Path, dir: &Path, name: &str) {
        let tmp = dir.join(format!(".{name}.tmp-test"));
        std::fs::copy(src.join(name), &tmp).unwrap();
        std::fs::rename(&tmp, dir.join(name)).unwrap();
    }

    #[test]
    fn an_init_being_written_is_read_before_its_manifest_and_a_file_left_before_is_not_used() {
        crate::testutil::one_torch_thread();
        let (model, opt) = trained();
        let src = crate::testutil::scratch_dir("ckpt-early-src");
        write_at_step_2(&src, &model, &opt).unwrap();
        // Another model's checkpoint, whose weights are left in place by an earlier attempt.
        let stale_src = crate::testutil::scratch_dir("ckpt-early-stale");
        let other = ByteGpt::new(&tiny(), Device::Cpu, 5);
        write(
            &stale_src,
            &other,
            &AdamW::new(&other.params, 0.1),
            1,
            &state(),
            &LossHistory::default(),
            None,
        )
        .unwrap();
        for left_before in [false, true] {
            let dir = crate::testutil::scratch_dir(&format!("ckpt-early-{left_before}"));
            if left_before {
                put_in_place(&stale_src, &dir, MODEL_FILE);
            }
            let writer = {
                let (src, dir) = (src.to_path_buf(), dir.to_path_buf());
                std::thread::spawn(move || {
                    // The writer's order: each file whole, the manifest well after.
                    std::thread::sleep(Duration::from_millis(100));
                    put_in_place(&src, &dir, MODEL_FILE);
                    put_in_place(&src, &dir, OPTIMIZER_FILE);
                    std::thread::sleep(Duration::from_millis(300));
                    put_in_place(&src, &dir, MANIFEST_FILE);
                })
            };
            let (v, waited, _) = open_init(&early_spec(&dir), &dir).unwrap();
            writer.join().unwrap();
            assert!(waited >= Duration::from_millis(390), "{waited:?}");
            assert!(v.read_early(), "left before: {left_before}");
            // The weights are the new checkpoint's, and their checksum is the listed one.
            v.finish().unwrap();
            let back = ByteGpt::new(&tiny(), Device::Cpu, 99);
            v.load_model(&back).unwrap();
            assert!(back.params.flat.equal(&model.params.flat));
        }
        // Not being written: no wait, read as before.
        let (v, waited, _) = {
            let mut spec = early_spec(&src);
            spec.inputs_being_written.clear();
            open_init(&spec, &src).unwrap()
        };
        assert_eq!(waited, Duration::ZERO);
        assert!(!v.read_early());
    }

    #[test]
    fn bytes_read_early_from_a_file_since_replaced_are_not_used() {
        crate::testutil::one_torch_thread();
        let dir = crate::testutil::scratch_dir("ckpt-early-replaced");
        std::fs::write(dir.join(MODEL_FILE), b"old bytes").unwrap();
        let early = EarlyRead::start(&dir.join(MODEL_FILE)).unwrap();
        let tmp = dir.join("new");
        std::fs::write(&tmp, b"the new bytes").unwrap();
        std::fs::rename(&tmp, dir.join(MODEL_FILE)).unwrap();
        let listed = ManifestFile {
            path: MODEL_FILE.into(),
            bytes: 13,
            checksum: checksum(b"the new bytes"),
        };
        let (bytes, early) = early.into_bytes(&dir.join(MODEL_FILE), &listed).unwrap();
        assert_eq!(bytes, b"the new bytes");
        assert!(!early);
    }

    #[test]
    fn truncated_file_is_refused_by_name_and_size() {
        crate::testutil::one_torch_thread();
        let dir = crate::testutil::scratch_dir("ckpt-truncated");
        let (model, opt) = trained();
        let (manifest, _) = write_at_step_2(&dir, &model, &opt).unwrap();
        let full = manifest.files[0].bytes;
        let path = dir.join(MODEL_FILE);
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
        let err = open_verified(&dir).err().unwrap();
        assert_eq!(err.kind, FailureKind::BadInput);
        let expected = format!(
            "checkpoint {} is truncated: {} of {full} bytes",
            path.display(),
            full / 2
        );
        assert_eq!(err.message, expected);
    }

    #[test]
    fn corrupted_byte_and_missing_file_are_refused() {
        crate::testutil::one_torch_thread();
        let dir = crate::testutil::scratch_dir("ckpt-corrupt");
        let (model, opt) = trained();
        write_at_step_2(&dir, &model, &opt).unwrap();
        let path = dir.join(OPTIMIZER_FILE);
        let mut bytes = std::fs::read(&path).unwrap();
        let i = bytes.len() - 3;
        bytes[i] ^= 0x40;
        std::fs::write(&path, &bytes).unwrap();
        let err = open_verified(&dir).err().unwrap();
        assert_eq!(err.kind, FailureKind::BadInput);
        assert!(
            err.message.contains("optimizer.safetensors is corrupted"),
            "{}",
            err.message
        );

        std::fs::remove_file(&path).unwrap();
        let err = open_verified(&dir).err().unwrap();
        assert!(
            err.message.ends_with("optimizer.safetensors is missing"),
            "{}",
            err.message
        );

        std::fs::remove_file(dir.join(MANIFEST_FILE)).unwrap();
        let err = open_verified(&dir).err().unwrap();
        assert_eq!(err.kind, FailureKind::BadInput);
        assert!(
            err.message.contains("manifest.json is missing"),
            "{}",
            err.message
        );
    }

    #[test]
    fn a_version_1_manifest_is_read_with_sha256_and_an_unknown_version_is_refused() {
        use protocol::checkpoint::Algorithm;
        crate::testutil::one_torch_thread();
        let dir = crate::testutil::scratch_dir("ckpt-v1");
        let (model, opt) = trained();
        let (mut manifest, _) = write_at_step_2(&dir, &model, &opt).unwrap();
        // Rewrite the manifest as an older worker wrote it: version 1, SHA-256 per file.
        let rewrite = |manifest: &CheckpointManifest| {
            std::fs::write(
                dir.join(MANIFEST_FILE),
                serde_json::to_vec(manifest).unwrap(),
            )
            .unwrap()
        };
        manifest.v = 1;
        for f in &mut manifest.files {
            let bytes = std::fs::read(dir.join(&f.path)).unwrap();
            f.checksum = Checksum::of(Algorithm::Sha256, &bytes);
        }
        rewrite(&manifest);
        let text = std::fs::read_to_string(dir.join(MANIFEST_FILE)).unwrap();
        assert!(
            text.contains("\"sha256\"") && !text.contains("blake3"),
            "{text}"
        );
        let v = open_verified(&dir).unwrap();
        let back = ByteGpt::new(&tiny(), Device::Cpu, 99);
        v.load_model(&back).unwrap();
        assert!(back.params.flat.equal(&model.params.flat));
        // Its SHA-256 is checked: a wrong one is a corruption.
        manifest.files[0].checksum = Checksum::Sha256("0".repeat(64));
        rewrite(&manifest);
        let err = open_verified(&dir).err().unwrap();
        assert_eq!(err.kind, FailureKind::BadInput);
        assert!(
            err.message
                .contains("is corrupted: its checksum is sha256 "),
            "{}",
            err.message
        );
        // A version this worker does not know is refused, naming the versions it reads.
        manifest.v = MANIFEST_VERSION + 1;
        rewrite(&manifest);
        let err = open_verified(&dir).err().unwrap();
        assert_eq!(err.kind, FailureKind::BadInput);
        assert!(
            err.message.contains("reads versions 1–2"),
            "{}",
            err.message
        );
    }

    #[test]
    fn escaping_paths_in_a_manifest_are_refused() {
        crate::testutil::one_torch_thread();
        let dir = crate::testutil::scratch_dir("ckpt-escape");
        let manifest = CheckpointManifest {
            v: MANIFEST_VERSION,
            files: vec![ManifestFile {
                path: "../etc/passwd".into(),
                bytes: 1,
                checksum: Checksum::Sha256("00".into()),
            }],
            step: None,
            model: serde_json::Value::Null,
        };
        std::fs::write(
            dir.join(MANIFEST_FILE),
            serde_json::to_vec(&manifest).unwrap(),
        )
        .unwrap();
        let err = open_verified(&dir).err().unwrap();
        assert!(err.message.contains("not a path inside"), "{}", err.message);
    }
}
