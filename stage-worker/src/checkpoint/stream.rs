//! Writing safetensors files at page-cache speed, and to the disk behind it: one pass over the
//! bytes.
//!
//! A file is a header followed by *runs*: literal bytes, or a range of a flat fp32 tensor (the
//! model's parameters and the optimizer's moments each live in one flat buffer, so a whole
//! file's data is one or two runs). Its layout is known before the first byte, so each 32 MiB
//! chunk has its offset in the file from the start. Each file is written by a pipeline: a
//! copier that copies the next chunk from the device into a recycled host buffer (page-locked
//! ahead of time where the device allows it, see [`pin_host_buffers`]; on the CPU the tensor's
//! memory is used in place), a hasher that feeds the chunks to BLAKE3 in order
//! ([`crate::checkpoint::fsio::algorithm`]), and writers (one by default, see
//! [`crate::checkpoint::writeback::WriteSettings`]) that write each chunk at its offset (`pwrite`) into a
//! temporary file. The writers do not wait for the disk: by default a thread of its own starts
//! the write-back of each range they finished ([`crate::checkpoint::writeback`]), so the file reaches the
//! page cache as fast as the kernel takes it and the final fsync has little left to do. The
//! bytes are never read back; the checksum in the manifest is the one computed on the way out.
//! The files are written in parallel, each renamed into place as soon as it is complete.
//!
//! Promises: [`write_files_unsynced`] returns as soon as every file is complete and in place
//! in the page cache (what a reader on this machine sees), and each file is in place only once
//! all of its bytes are; once its [`Unsynced::sync`] returns, they are complete on disk
//! (fsynced, renamed into place, directory fsynced); a manifest entry's size and checksum are
//! those of the bytes written, whatever the number of writers; the same tensors always give the
//! same bytes; a failed write leaves neither the file nor its temporary file behind.

use crate::checkpoint::fsio::{fsync_dir, WrittenFile};
use crate::checkpoint::writeback::{start_write_back, Flusher, WriteBack, WriteSettings};
use protocol::checkpoint::{Checksum, FileIdentity, Hasher, ManifestFile};
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Instant;
use tch::{Device, Kind, Tensor};

/// Bytes per chunk: large enough that each write is one big system call, small enough that a
/// few chunks in flight per file stay cheap.
const CHUNK: usize = 32 << 20;
/// Pageable host buffers per file (device copies only), beyond the pinned ones the pool lends:
/// then the copier reuses the buffers the writer is done with.
const BUFFERS: usize = 8;

/// At most this many host buffers are page-locked ([`pin_host_buffers`]): 2 GiB, enough for a
/// whole checkpoint of the 100M model (1.2 GB); a larger checkpoint uses them and then
/// recycles buffers as before.
pub const MAX_PINNED_BUFFERS: usize = 64;

/// How many chunk buffers hold every run of `numel` floats in each of `runs` runs at once.
pub fn buffers_for(numel: i64, runs: usize) -> usize {
    let chunks = (numel.max(0) as usize * 4).div_ceil(CHUNK);
    (chunks * runs).min(MAX_PINNED_BUFFERS)
}

/// Page-locked (pinned) chunk buffers, registered with the CUDA driver: the device copies into
/// them by DMA at the bus's speed, where a copy into pageable memory goes through the driver's
/// staging buffer at about 2 GB/s. Made once per process, lent to each checkpoint's copiers and
/// given back after; never freed or unregistered (the process exits, or its CUDA context is
/// destroyed, which drops the registration).
static PINNED: Mutex<Vec<HostBuf>> = Mutex::new(Vec::new());
/// Set when a checkpoint starts, so that [`pin_host_buffers`] stops early.
static PIN_STOP: AtomicBool = AtomicBool::new(false);
/// The thread started by [`pin_host_buffers_in_background`], joined before a checkpoint's
/// copies start (and so before the device can be released).
static PIN_THREAD: Mutex<Option<std::thread::JoinHandle<usize>>> = Mutex::new(None);

/// Whether checkpoints should copy through pinned host buffers (`STAGE_WORKER_PINNED=0` turns
/// it off).
pub fn pinning_wanted(device: Device) -> bool {
    device.is_cuda() && std::env::var("STAGE_WORKER_PINNED").map_or(true, |v| v != "0")
}

/// Allocates up to `count` chunk buffers and page-locks them with `cudaHostRegister`, adding
/// them to the pool the checkpoint copiers draw from; returns how many were pinned. Stops early
/// when a checkpoint starts. Only for a process whose CUDA device is in use (the call would
/// otherwise create a context). A buffer the driver refuses is dropped, and the copies then use
/// pageable buffers as before.
pub fn pin_host_buffers(count: usize) -> usize {
    type Register = unsafe extern "C" fn(*mut libc::c_void, usize, u32) -> i32;
    type LastError = unsafe extern "C" fn() -> i32;
    // SAFETY: dlsym of NUL-terminated names in the global scope (libcudart is a dependency of
    // libtorch_cuda, which this binary links); the types match the CUDA runtime's
    // `cudaHostRegister(void*, size_t, unsigned)` and `cudaGetLastError(void)`.
    let (register, last_error) = unsafe {
        let r = libc::dlsym(libc::RTLD_DEFAULT, c"cudaHostRegister".as_ptr());
        let e = libc::dlsym(libc::RTLD_DEFAULT, c"cudaGetLastError".as_ptr());
        if r.is_null() || e.is_null() {
            return 0;
        }
        (
            std::mem::transmute::<*mut libc::c_void, Register>(r),
            std::mem::transmute::<*mut libc::c_void, LastError>(e),
        )
    };
    let mut pinned = 0;
    while pinned < count && !PIN_STOP.load(Ordering::Acquire) {
        let mut buf = host_buffer();
        // Fault every page in first, outside the driver: registering then only locks pages
        // that exist (faulting them inside `cudaHostRegister` held up the training thread's
        // kernel launches in the benchmark).
        for page in buf.chunks_mut(1024) {
            page[0] = 0.0;
        }
        // SAFETY: the buffer is a live allocation of CHUNK bytes; it is leaked below (never
        // freed while registered). A failed call leaves an error in this thread's
        // last-error slot, which is cleared so that no later check on this thread sees it.
        let ok = unsafe { register(buf.as_mut_ptr().cast(), CHUNK, 0) == 0 };
        if !ok {
            // SAFETY: see above.
            unsafe {
                last_error();
            }
            break;
        }
        let leaked: &'static mut [f32] = Vec::leak(buf);
        PINNED
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(HostBuf::Pinned(leaked));
        pinned += 1;
    }
    pinned
}

/// How many buffers [`start_planned_pinning`] should pin.
static PLANNED: AtomicUsize = AtomicUsize::new(0);

/// Asks for `count` pinned buffers, to be made by [`start_planned_pinning`].
pub fn plan_pinning(count: usize) {
    PLANNED.store(count, Ordering::Release);
}

/// Starts pinning the buffers [`plan_pinning`] asked for, if any, on a thread of its own. The
/// stage calls it after its first training step: registering host memory with the driver
/// while that step's kernels load and its memory is allocated made the step several times
/// slower in the benchmark; during the steady steps it costs nothing measurable.
pub fn start_planned_pinning() {
    let count = PLANNED.swap(0, Ordering::AcqRel);
    if count > 0 {
        pin_host_buffers_in_background(count);
    }
}

/// Starts [`pin_host_buffers`] of `count` buffers on a thread of its own (while the stage
/// trains); the next checkpoint stops and joins it before its first copy.
pub fn pin_host_buffers_in_background(count: usize) {
    PIN_STOP.store(false, Ordering::Release);
    let handle = std::thread::spawn(move || pin_host_buffers(count));
    *PIN_THREAD.lock().unwrap_or_else(|e| e.into_inner()) = Some(handle);
}

/// Stops and joins the pinning thread, if one runs; returns how many buffers it pinned.
fn finish_pinning() -> Option<usize> {
    PIN_STOP.store(true, Ordering::Release);
    let handle = PIN_THREAD
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()?;
    handle.join().ok()
}

/// How many pinned buffers the pool holds now.
pub fn pinned_buffers() -> usize {
    PINNED.lock().unwrap_or_else(|e| e.into_inner()).len()
}

/// `t_NAME_STEM` (STEM: the file name up to its first dot) with `at` in Unix seconds.
fn phase(name: &str, file: &str, at: Instant) -> (String, f64) {
    let stem = file.split('.').next().unwrap_or(file);
    let unix = crate::log::unix_now() - at.elapsed().as_secs_f64();
    (format!("t_{name}_{stem}"), unix)
}

/// A chunk-sized host buffer: from the heap, or pinned and lent by the pool.
enum HostBuf {
    Heap(Vec<f32>),
    Pinned(&'static mut [f32]),
}

impl HostBuf {
    fn as_mut_ptr(&mut self) -> *mut f32 {
        match self {
            HostBuf::Heap(v) => v.as_mut_ptr(),
            HostBuf::Pinned(s) => s.as_mut_ptr(),
        }
    }

    fn as_ptr(&self) -> *const f32 {
        match self {
            HostBuf::Heap(v) => v.as_ptr(),
            HostBuf::Pinned(s) => s.as_ptr(),
        }
    }
}

/// Part of a file's data.
pub enum Run {
    /// These bytes.
    Bytes(Vec<u8>),
    /// Elements `offset..offset + numel` of a contiguous one-dimensional fp32 tensor, as
    /// little-endian bytes.
    Floats {
        /// The flat tensor (on any device).
        tensor: Tensor,
        /// First element.
        offset: i64,
        /// Element count.
        numel: i64,
    },
}

impl Run {
    fn len(&self) -> usize {
        match self {
            Run::Bytes(b) => b.len(),
            Run::Floats { numel, .. } => *numel as usize * 4,
        }
    }
}

/// One tensor's entry in a safetensors header.
pub struct HeaderEntry {
    /// Tensor name.
    pub name: String,
    /// Safetensors dtype name ("F32", "I64").
    pub dtype: &'static str,
    /// Shape.
    pub shape: Vec<i64>,
    /// Size of its data in bytes.
    pub bytes: usize,
}

/// The safetensors header (length prefix, JSON, space padding to 8 bytes) for tensors laid out
/// back to back in `entries` order, with `metadata` as its `__metadata__` (a JSON object of
/// strings, such as transformers' `{"format": "pt"}`) when given.
pub fn header(entries: &[HeaderEntry], metadata: Option<&serde_json::Value>) -> Vec<u8> {
    let mut map = serde_json::Map::new();
    if let Some(m) = metadata {
        map.insert("__metadata__".into(), m.clone());
    }
    let mut at = 0usize;
    for e in entries {
        map.insert(
            e.name.clone(),
            serde_json::json!({"dtype": e.dtype, "shape": e.shape, "data_offsets": [at, at + e.bytes]}),
        );
        at += e.bytes;
    }
    let mut json = serde_json::to_vec(&serde_json::Value::Object(map)).expect("header serializes");
    while (8 + json.len()) % 8 != 0 {
        json.push(b' ');
    }
    let mut out = Vec::with_capacity(8 + json.len());
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(&json);
    out
}

/// A file to write: its name in the directory and its contents in order.
pub struct FileSpec {
    /// File name.
    pub name: String,
    /// Contents, in order.
    pub runs: Vec<Run>,
}

/// Files complete and renamed into place, not yet fsynced: a reader sees every byte (from the
/// page cache) and can check it against the checksum; a power loss before [`Unsynced::sync`]
/// may lose them.
pub struct Unsynced {
    dir: std::path::PathBuf,
    files: Vec<Streamed>,
}

/// A file written and in place: its record, its open handle for the fsync, and the thread
/// still starting its write-back, if any.
struct Streamed {
    written: WrittenFile,
    file: File,
    flusher: Option<Flusher>,
}

impl Unsynced {
    /// The files, in the order given.
    pub fn written(&self) -> impl Iterator<Item = &WrittenFile> {
        self.files.iter().map(|f| &f.written)
    }

    /// These files and then `later`'s, all in this directory (`later` was written into it too).
    pub fn and(mut self, later: Unsynced) -> Unsynced {
        debug_assert_eq!(self.dir, later.dir);
        self.files.extend(later.files);
        self
    }

    /// fsyncs every file (in parallel) and then the directory; returns the files with their
    /// `synced` phase.
    pub fn sync(self) -> io::Result<Vec<WrittenFile>> {
        let synced: Vec<io::Result<WrittenFile>> = std::thread::scope(|s| {
            let handles: Vec<_> = self
                .files
                .into_iter()
                .map(|f| {
                    s.spawn(move || {
                        // The fsync writes whatever the flusher has not started yet.
                        if let Some(flusher) = f.flusher {
                            flusher.stop();
                        }
                        f.file.sync_all()?;
                        let mut w = f.written;
                        let stem = w.entry.path.clone();
                        w.phases.push(phase("synced", &stem, Instant::now()));
                        Ok(w)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(io::Error::other("checkpoint fsync panicked")))
                })
                .collect()
        });
        let synced = synced.into_iter().collect::<io::Result<Vec<_>>>()?;
        fsync_dir(&self.dir)?;
        Ok(synced)
    }
}

/// Writes every file into `dir` in parallel, each atomically (temporary file, then rename),
/// without waiting for the disk: [`Unsynced::sync`] fsyncs them and the directory. Returns them in the order given. Calls `after_copies` (once, on one of the writing threads) as soon as
/// every byte of every file has been copied off the device, while the files are still being
/// written: the caller can give the device back then. Not called if a file fails before that.
pub fn write_files_unsynced(
    dir: &Path,
    files: Vec<FileSpec>,
    after_copies: Option<&(dyn Fn() + Sync)>,
) -> io::Result<Unsynced> {
    write_files_with(dir, files, after_copies, WriteSettings::from_env())
}

/// [`write_files_unsynced`] with these settings rather than the environment's.
fn write_files_with(
    dir: &Path,
    files: Vec<FileSpec>,
    after_copies: Option<&(dyn Fn() + Sync)>,
    settings: WriteSettings,
) -> io::Result<Unsynced> {
    // No buffer is being registered while the files are copied, or when the device is
    // released after the copies.
    finish_pinning();
    let copying = AtomicUsize::new(files.len());
    let copied = || {
        if copying.fetch_sub(1, Ordering::AcqRel) == 1 {
            if let Some(f) = after_copies {
                f();
            }
        }
    };
    let copied = &copied;
    let results: Vec<io::Result<Streamed>> = std::thread::scope(|s| {
        let handles: Vec<_> = files
            .into_iter()
            .map(|f| s.spawn(move || write_one(dir, f, copied, settings)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(io::Error::other("checkpoint writer panicked")))
            })
            .collect()
    });
    let files = results.into_iter().collect::<io::Result<Vec<_>>>()?;
    Ok(Unsynced {
        dir: dir.to_path_buf(),
        files,
    })
}

/// A chunk on its way from the producer to the writers.
enum Chunk<'a> {
    Borrowed(&'a [u8]),
    Owned(HostBuf, usize),
}

impl Chunk<'_> {
    fn bytes(&self) -> &[u8] {
        match self {
            Chunk::Borrowed(b) => b,
            Chunk::Owned(v, len) => {
                // SAFETY: a buffer of at least `len / 4` f32s is `len` initialised bytes.
                unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), *len) }
            }
        }
    }
}

/// A chunk and where its bytes go in the file (the layout is known before the first byte, so
/// each writer writes its chunks at their own offsets, in any order).
struct Piece<'a> {
    at: u64,
    chunk: Chunk<'a>,
}

/// One file written to a temporary name and renamed into place, not fsynced; its open handle
/// for the fsync.
fn write_one(
    dir: &Path,
    spec: FileSpec,
    copied: &dyn Fn(),
    settings: WriteSettings,
) -> io::Result<Streamed> {
    let tmp = dir.join(format!(".{}.tmp-{}", spec.name, std::process::id()));
    let result = stream_to(&tmp, &spec.runs, copied, settings).and_then(|out| {
        let path = dir.join(&spec.name);
        fs::rename(&tmp, &path)?;
        let written = WrittenFile {
            path,
            entry: ManifestFile {
                path: spec.name.clone(),
                bytes: out.bytes,
                checksum: out.checksum,
            },
            identity: Some(out.identity),
            phases: ["copied", "hashed", "written"]
                .iter()
                .zip(out.times)
                .filter_map(|(name, at)| Some(phase(name, &spec.name, at?)))
                .collect(),
        };
        Ok(Streamed {
            written,
            file: out.file,
            flusher: out.flusher,
        })
    });
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// When a file's data was all copied off the device, hashed, and written.
type Times = [Option<Instant>; 3];

/// What [`stream_to`] made: the file's checksum, size, identity, phase times, open handle and
/// write-back thread.
struct StreamOut {
    checksum: Checksum,
    bytes: u64,
    identity: FileIdentity,
    times: Times,
    file: File,
    flusher: Option<Flusher>,
}

/// How many chunks `runs` are sent as.
fn chunk_count(runs: &[Run]) -> usize {
    runs.iter()
        .map(|r| match r {
            Run::Bytes(_) => 1,
            Run::Floats { numel, .. } => (*numel as usize * 4).div_ceil(CHUNK),
        })
        .sum()
}

/// Streams `runs` into a new file at `path` (its write-back started as `settings` say, never
/// waited for); returns what [`StreamOut`] holds. `copied` is called once every run has been
/// copied off the device.
fn stream_to(
    path: &Path,
    runs: &[Run],
    copied: &dyn Fn(),
    settings: WriteSettings,
) -> io::Result<StreamOut> {
    let mut times: Times = [None; 3];
    let file = File::create(path)?;
    let total: usize = runs.iter().map(Run::len).sum();
    let writers = settings.writers.clamp(1, chunk_count(runs).max(1));
    let (flusher, ranges) = match settings.write_back {
        WriteBack::Behind => {
            let (f, send) = Flusher::start(&file)?;
            (Some(f), Some(send))
        }
        WriteBack::Inline | WriteBack::AtSync => (None, None),
    };
    // A pipeline, so that the device copies, the hash and the page cache all work at once:
    // this thread copies chunks off the device, a hasher feeds them to BLAKE3 in order, and
    // `writers` threads write each at its offset (`pwrite`), then hand its range to the
    // write-back (see `crate::checkpoint::writeback`).
    // Room for every buffer there can be (the pinned ones and BUFFERS more), so that the copies
    // wait for a free buffer only, never for the hash: with the pinned pool holding the whole
    // checkpoint, the device's part ends right after the last step.
    let (to_hasher, from_copier) = mpsc::sync_channel::<Piece>(MAX_PINNED_BUFFERS + BUFFERS);
    let (to_writers, from_hasher) = mpsc::sync_channel::<Piece>(MAX_PINNED_BUFFERS + BUFFERS);
    // Shared by the writers; dropped with the last of them, which ends the hasher's sends.
    let from_hasher = Arc::new(Mutex::new(from_hasher));
    let (recycle, recycled) = mpsc::channel::<HostBuf>();
    let failed = AtomicBool::new(false);
    let (file_ref, failed_ref) = (&file, &failed);
    let (hash, write_result) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..writers)
            .map(|_| {
                let (queue, recycle, ranges) =
                    (from_hasher.clone(), recycle.clone(), ranges.clone());
                s.spawn(move || {
                    write_pieces(
                        file_ref,
                        path,
                        &queue,
                        &recycle,
                        ranges.as_ref(),
                        settings,
                        failed_ref,
                    )
                })
            })
            .collect();
        // The writers hold the only handles now: once they are all gone, the hasher's sends
        // fail, the flusher's ranges end and no buffer comes back.
        drop((from_hasher, recycle, ranges));
        let hasher = s.spawn(move || hash_pieces(from_copier, to_writers));
        let complete = copy_runs(runs, to_hasher, &recycled);
        let copies_done = complete.then(Instant::now);
        if complete {
            copied();
        }
        let hash = hasher.join();
        let written = join_writers(handles);
        times[0] = copies_done;
        match hash {
            Ok((hash, hashed)) => {
                times[1] = Some(hashed);
                (hash, written)
            }
            Err(_) => (
                // Never used: the error below ends the write.
                Checksum::Blake3(String::new()),
                Err(io::Error::other("checkpoint hasher thread panicked")),
            ),
        }
    });
    // The pinned buffers go back to the pool for the next checkpoint.
    {
        let mut pool = PINNED.lock().unwrap_or_else(|e| e.into_inner());
        pool.extend(
            recycled
                .try_iter()
                .filter(|b| matches!(b, HostBuf::Pinned(_))),
        );
    }
    times[2] = Some(write_result?);
    let meta = file.metadata()?;
    if meta.len() != total as u64 {
        return Err(io::Error::other(format!(
            "wrote {} bytes of {total}",
            meta.len()
        )));
    }
    Ok(StreamOut {
        checksum: hash,
        bytes: total as u64,
        identity: FileIdentity::of(&meta),
        times,
        file,
        flusher,
    })
}

/// A writer of [`stream_to`]: takes pieces off `queue` and writes each at its offset, then
/// starts its write-back as `settings` say (itself, or by handing the range to the flusher's
/// `ranges`) and sends an owned buffer back on `recycle`. Returns when the queue is empty and
/// closed, or another writer failed (`failed`), with the time it ended; an error sets `failed`.
fn write_pieces(
    file: &File,
    path: &Path,
    queue: &Mutex<mpsc::Receiver<Piece<'_>>>,
    recycle: &mpsc::Sender<HostBuf>,
    ranges: Option<&mpsc::Sender<(u64, usize)>>,
    settings: WriteSettings,
    failed: &AtomicBool,
) -> io::Result<Instant> {
    loop {
        let next = queue.lock().unwrap_or_else(|e| e.into_inner()).recv();
        // Every piece taken, or another writer failed: this one is done.
        let Ok(piece) = next else {
            return Ok(Instant::now());
        };
        if failed.load(Ordering::Acquire) {
            return Ok(Instant::now());
        }
        let bytes = piece.chunk.bytes();
        if let Err(e) = write_at(file, path, bytes, piece.at) {
            failed.store(true, Ordering::Release);
            return Err(e);
        }
        match (settings.write_back, ranges) {
            (WriteBack::Inline, _) => start_write_back(file, piece.at, bytes.len()),
            (WriteBack::Behind, Some(r)) => {
                let _ = r.send((piece.at, bytes.len()));
            }
            _ => {}
        }
        if let Chunk::Owned(v, _) = piece.chunk {
            let _ = recycle.send(v);
        }
    }
}

/// The hasher of [`stream_to`]: feeds the pieces, in order, to the checksum and passes each on
/// to the writers. Returns the checksum and when it was done.
fn hash_pieces<'a>(
    pieces: mpsc::Receiver<Piece<'a>>,
    to_writers: mpsc::SyncSender<Piece<'a>>,
) -> (Checksum, Instant) {
    let mut hasher = Hasher::new(crate::checkpoint::fsio::algorithm());
    for piece in pieces {
        hasher.update(piece.chunk.bytes());
        if to_writers.send(piece).is_err() {
            break;
        }
    }
    (hasher.finalize(), Instant::now())
}

/// The copier of [`stream_to`] (the calling thread): cuts `runs` into chunks, copies those on a
/// device into host buffers (recycled ones from `recycled` where it can) and sends each,
/// with its offset in the file, to the hasher. Whether every chunk was sent (the hasher gone
/// means a writer failed).
fn copy_runs<'a>(
    runs: &'a [Run],
    to_hasher: mpsc::SyncSender<Piece<'a>>,
    recycled: &mpsc::Receiver<HostBuf>,
) -> bool {
    let mut made = 0usize;
    // Each chunk goes at the offset after the one before. Returning drops `to_hasher`, which
    // tells the hasher that the last chunk was sent.
    let mut at = 0u64;
    let mut send = |chunk: Chunk<'a>| {
        let len = Chunk::bytes(&chunk).len() as u64;
        let sent = to_hasher.send(Piece { at, chunk }).is_ok();
        at += len;
        sent
    };
    for run in runs {
        match run {
            Run::Bytes(b) => {
                if !send(Chunk::Borrowed(b)) {
                    return false;
                }
            }
            Run::Floats {
                tensor,
                offset,
                numel,
            } => {
                let per_chunk = (CHUNK / 4) as i64;
                let mut done = 0i64;
                while done < *numel {
                    let n = per_chunk.min(numel - done);
                    let chunk = float_chunk(tensor, offset + done, n, recycled, &mut made);
                    if !send(chunk) {
                        return false;
                    }
                    done += n;
                }
            }
        }
    }
    true
}

/// Waits for the writers of [`stream_to`]: the last one's end, or the error of the one that
/// failed.
fn join_writers(
    handles: Vec<std::thread::ScopedJoinHandle<'_, io::Result<Instant>>>,
) -> io::Result<Instant> {
    let (mut last, mut error) = (None, None);
    for h in handles {
        match h
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("checkpoint writer thread panicked")))
        {
            Ok(t) => last = last.max(Some(t)),
            Err(e) => {
                error.get_or_insert(e);
            }
        }
    }
    match (error, last) {
        (Some(e), _) => Err(e),
        (None, Some(t)) => Ok(t),
        (None, None) => Err(io::Error::other("no checkpoint writer ran")),
    }
}

/// Writes `bytes` at `at` in `file` (the temporary file at `path`).
fn write_at(file: &File, path: &Path, bytes: &[u8], at: u64) -> io::Result<()> {
    #[cfg(test)]
    injected_write_error(path, at)?;
    #[cfg(not(test))]
    let _ = path;
    file.write_all_at(bytes, at)
}

/// A fresh chunk-sized host buffer, backed by huge pages where the kernel allows it (a 32 MiB
/// buffer is then a few page faults on its first copy, not eight thousand).
fn host_buffer() -> Vec<f32> {
    // (Pinned buffers are made from these too, in `pin_host_buffers`.)
    let buf = vec![0f32; CHUNK / 4];
    let page = 2 << 20;
    let start = buf.as_ptr() as usize;
    let aligned = (start + page - 1) & !(page - 1);
    let len = (start + CHUNK - aligned) & !(page - 1);
    if len > 0 {
        // SAFETY: advice on whole huge pages inside the buffer's own allocation; it changes no
        // contents (the pages are untouched zero pages) and errors are harmless.
        unsafe {
            libc::madvise(aligned as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
        }
    }
    buf
}

/// Elements `offset..offset + n` of the flat fp32 `tensor` as a chunk: borrowed in place on
/// the CPU, copied into a recycled host buffer from a device.
fn float_chunk<'a>(
    tensor: &'a Tensor,
    offset: i64,
    n: i64,
    recycled: &mpsc::Receiver<HostBuf>,
    made: &mut usize,
) -> Chunk<'a> {
    assert_eq!(tensor.kind(), Kind::Float, "checkpoint runs are fp32");
    assert!(tensor.is_contiguous() && tensor.dim() == 1);
    assert!(offset >= 0 && offset + n <= tensor.numel() as i64);
    if tensor.device() == Device::Cpu {
        // SAFETY: the tensor is a contiguous fp32 CPU tensor of at least offset + n elements,
        // alive and unmodified for the lifetime of the borrow (the caller holds it while the
        // file is written).
        let bytes = unsafe {
            let base = tensor.data_ptr().cast::<u8>().add(offset as usize * 4);
            std::slice::from_raw_parts(base, n as usize * 4)
        };
        return Chunk::Borrowed(bytes);
    }
    // A pinned buffer while the pool has one (so that the copies need not wait for the hash and
    // the disk, and the device can be given back early), else up to BUFFERS from the heap, else
    // one the writer is done with.
    let lent = PINNED.lock().unwrap_or_else(|e| e.into_inner()).pop();
    let mut buf = if let Some(buf) = lent {
        buf
    } else if *made < BUFFERS {
        *made += 1;
        HostBuf::Heap(host_buffer())
    } else {
        recycled
            .recv()
            .unwrap_or_else(|_| HostBuf::Heap(host_buffer()))
    };
    // SAFETY: `buf` holds at least `n` f32s and outlives `host`, which is dropped at the end
    // of this block, after the synchronous copy.
    unsafe {
        let mut host = Tensor::from_blob(
            buf.as_mut_ptr().cast::<u8>(),
            &[n],
            &[1],
            Kind::Float,
            Device::Cpu,
        );
        host.copy_(&tensor.narrow(0, offset, n));
    }
    Chunk::Owned(buf, n as usize * 4)
}

/// Directories in which every checkpoint write at or past an offset fails (tests only).
#[cfg(test)]
static FAILING_WRITES: Mutex<Vec<(std::path::PathBuf, u64)>> = Mutex::new(Vec::new());

/// Makes every write into a file in `dir` at or past offset `from` fail (tests only).
#[cfg(test)]
pub fn fail_writes_in(dir: &Path, from: u64) {
    FAILING_WRITES
        .lock()
        .unwrap()
        .push((dir.to_path_buf(), from));
}

#[cfg(test)]
fn injected_write_error(path: &Path, at: u64) -> io::Result<()> {
    let failing = FAILING_WRITES.lock().unwrap();
    if failing
        .iter()
        .any(|(dir, from)| path.parent() == Some(dir) && at >= *from)
    {
        return Err(io::Error::other(format!("injected write error at {at}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn streamed_file_is_header_then_runs_and_its_checksum_is_of_those_bytes() {
        crate::testutil::one_torch_thread();
        let dir = crate::testutil::scratch_dir("stream");
        // More than one chunk, and an offset that is not a chunk boundary.
        let n = (CHUNK / 4) as i64 + 1000;
        let t = Tensor::arange(n + 7, (Kind::Float, Device::Cpu));
        let head = header(
            &[HeaderEntry {
                name: "x".into(),
                dtype: "F32",
                shape: vec![n],
                bytes: n as usize * 4,
            }],
            None,
        );
        let files = vec![FileSpec {
            name: "a.safetensors".into(),
            runs: vec![
                Run::Bytes(head.clone()),
                Run::Floats {
                    tensor: t.shallow_clone(),
                    offset: 7,
                    numel: n,
                },
            ],
        }];
        let unsynced = write_files_unsynced(&dir, files, None).unwrap();
        // Before any fsync the file is in place, whole, with the checksum it will be listed
        // under (what a downstream stage started early reads).
        let before = std::fs::read(dir.join("a.safetensors")).unwrap();
        let listed = unsynced.written().next().unwrap().entry.clone();
        assert_eq!(listed.checksum, crate::checkpoint::fsio::checksum(&before));
        let written = unsynced.sync().unwrap();
        assert!(written[0]
            .phases
            .iter()
            .any(|(name, _)| name == "t_synced_a"));
        let bytes = std::fs::read(dir.join("a.safetensors")).unwrap();
        assert_eq!(before, bytes);
        assert_eq!(written[0].entry.bytes, bytes.len() as u64);
        assert_eq!(
            written[0].entry.checksum,
            crate::checkpoint::fsio::checksum(&bytes)
        );
        let meta = std::fs::metadata(dir.join("a.safetensors")).unwrap();
        let id = written[0].identity.unwrap();
        assert_eq!((id.dev, id.ino), (meta.dev(), meta.ino()));
        assert_eq!(&bytes[..head.len()], &head[..]);
        // A safetensors file holding just the range of the tensor (parsed here rather than by
        // the checkpoint reader, which builds on this module).
        let parsed = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        assert_eq!(parsed.tensors().len(), 1);
        let back = Tensor::try_from(parsed.tensor("x").unwrap()).unwrap();
        assert!(back.equal(&t.narrow(0, 7, n)));
        // No temporary file is left.
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
    }

    #[test]
    fn as_many_pinned_buffers_as_the_runs_need_and_no_more_than_the_cap() {
        assert_eq!(buffers_for(0, 3), 0);
        assert_eq!(buffers_for(1, 3), 3);
        assert_eq!(buffers_for((CHUNK / 4) as i64, 3), 3);
        assert_eq!(buffers_for((CHUNK / 4) as i64 + 1, 3), 6);
        // The 100M model: 1.2 GB in 38 chunks; the 1B model's 12 GB: capped.
        assert_eq!(buffers_for(101_000_000, 3), 3 * 13);
        assert_eq!(buffers_for(1_000_000_000, 3), MAX_PINNED_BUFFERS);
    }

    #[test]
    fn the_after_copies_call_comes_once_for_all_files_and_the_files_are_whole() {
        crate::testutil::one_torch_thread();
        let dir = crate::testutil::scratch_dir("stream-after");
        let n = (CHUNK / 4) as i64 * 2 + 3;
        let t = Tensor::arange(n, (Kind::Float, Device::Cpu));
        let file = |name: &str| FileSpec {
            name: name.into(),
            runs: vec![
                Run::Bytes(b"head".to_vec()),
                Run::Floats {
                    tensor: t.shallow_clone(),
                    offset: 0,
                    numel: n,
                },
            ],
        };
        let calls = AtomicUsize::new(0);
        let count = || {
            calls.fetch_add(1, Ordering::SeqCst);
        };
        let written = write_files_unsynced(&dir, vec![file("a.bin"), file("b.bin")], Some(&count))
            .unwrap()
            .sync()
            .unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        for w in &written {
            let bytes = std::fs::read(&w.path).unwrap();
            assert_eq!(bytes.len() as u64, w.entry.bytes);
            assert_eq!(bytes.len(), 4 + n as usize * 4);
            assert_eq!(w.entry.checksum, crate::checkpoint::fsio::checksum(&bytes));
            let last = f32::from_le_bytes(bytes[bytes.len() - 4..].try_into().unwrap());
            assert_eq!(last, (n - 1) as f32);
        }
        // Each streamed file says when it passed each phase, in order.
        for w in &written {
            let stem = w.entry.path.split('.').next().unwrap();
            let names: Vec<String> = ["copied", "hashed", "written", "synced"]
                .iter()
                .map(|n| format!("t_{n}_{stem}"))
                .collect();
            let got: Vec<&String> = w.phases.iter().map(|(n, _)| n).collect();
            assert_eq!(got, names.iter().collect::<Vec<_>>());
            let times: Vec<f64> = w.phases.iter().map(|(_, t)| *t).collect();
            // copied ≤ hashed ≤ written ≤ synced (a millisecond's slack for the clock reads)
            assert!(times.windows(2).all(|t| t[0] <= t[1] + 1e-3), "{times:?}");
        }
        // Without the call, the same bytes.
        let dir2 = crate::testutil::scratch_dir("stream-after-none");
        let again = write_files_unsynced(&dir2, vec![file("a.bin")], None)
            .unwrap()
            .sync()
            .unwrap();
        assert_eq!(again[0].entry.checksum, written[0].entry.checksum);
    }

    /// A file of a header and two float runs (one not starting at a chunk boundary) across
    /// several chunks.
    fn several_chunks(t: &Tensor, n: i64) -> FileSpec {
        FileSpec {
            name: "many.safetensors".into(),
            runs: vec![
                Run::Bytes(b"a header of odd length".to_vec()),
                Run::Floats {
                    tensor: t.shallow_clone(),
                    offset: 3,
                    numel: n,
                },
                Run::Bytes(b"between".to_vec()),
                Run::Floats {
                    tensor: t.shallow_clone(),
                    offset: 0,
                    numel: n / 2,
                },
            ],
        }
    }

    #[test]
    fn several_writers_write_the_bytes_one_writer_writes_with_the_same_checksum() {
        crate::testutil::one_torch_thread();
        // Five pieces: three chunks of floats (the second run's one a short one) and two of bytes.
        let n = (CHUNK / 4) as i64 + 5;
        let t = Tensor::arange(n + 3, (Kind::Float, Device::Cpu)).sin();
        // The reference: one writer, its write-back started inline (how files were written
        // before several writers).
        let one = WriteSettings {
            writers: 1,
            write_back: WriteBack::Inline,
        };
        let dir = crate::testutil::scratch_dir("stream-one-writer");
        let reference = write_files_with(&dir, vec![several_chunks(&t, n)], None, one)
            .unwrap()
            .sync()
            .unwrap();
        let expected = std::fs::read(&reference[0].path).unwrap();
        // Which are the runs' bytes, back to back.
        let floats = |offset: i64, numel: i64| -> Vec<u8> {
            let v = Vec::<f32>::try_from(t.narrow(0, offset, numel)).unwrap();
            v.iter().flat_map(|f| f.to_le_bytes()).collect()
        };
        let mut runs = b"a header of odd length".to_vec();
        runs.extend(floats(3, n));
        runs.extend(b"between");
        runs.extend(floats(0, n / 2));
        assert!(expected == runs, "the file is not its runs");
        assert_eq!(expected.len() as u64, reference[0].entry.bytes);
        assert_eq!(
            reference[0].entry.checksum,
            crate::checkpoint::fsio::checksum(&expected)
        );
        for (writers, write_back) in [
            (4, WriteBack::Behind),
            (3, WriteBack::AtSync),
            (2, WriteBack::Inline),
            (16, WriteBack::Behind),
        ] {
            let dir = crate::testutil::scratch_dir(&format!("stream-{writers}-writers"));
            let settings = WriteSettings {
                writers,
                write_back,
            };
            let unsynced =
                write_files_with(&dir, vec![several_chunks(&t, n)], None, settings).unwrap();
            // In place and whole before the fsync.
            let before = std::fs::read(dir.join("many.safetensors")).unwrap();
            assert!(before == expected, "{settings:?}: other bytes");
            let written = unsynced.sync().unwrap();
            assert_eq!(written[0].entry, reference[0].entry, "{settings:?}");
            assert!(std::fs::read(&written[0].path).unwrap() == expected);
            assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        }
    }

    #[test]
    fn a_failed_write_leaves_no_file_in_place_and_no_temporary_file() {
        crate::testutil::one_torch_thread();
        let n = (CHUNK / 4) as i64 * 3 + 5;
        let t = Tensor::arange(n + 3, (Kind::Float, Device::Cpu));
        for writers in [1, 4] {
            let dir = crate::testutil::scratch_dir(&format!("stream-fails-{writers}"));
            // The second chunk's write fails; the others may have been written.
            fail_writes_in(&dir, CHUNK as u64);
            let settings = WriteSettings {
                writers,
                write_back: WriteBack::Behind,
            };
            let calls = AtomicUsize::new(0);
            let count = || {
                calls.fetch_add(1, Ordering::SeqCst);
            };
            let err = write_files_with(&dir, vec![several_chunks(&t, n)], Some(&count), settings)
                .err()
                .expect("the write fails");
            assert!(err.to_string().contains("injected write error"), "{err}");
            let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
            assert!(left.is_empty(), "{writers} writers left {left:?}");
        }
    }
}
