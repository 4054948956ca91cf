//! Reading the files a user names (ladders, manifests, choices, cache entries, id files): each is
//! opened once, checked to be a regular file through its open handle, and read with a size
//! limit, so a FIFO, a device or a huge file is refused by name instead of blocking the tool
//! or exhausting its memory. Also writing a file atomically (so a reader never sees a torn one),
//! and the escaping and shortening of file text before it reaches a terminal. A leaf: it names
//! nothing else in the crate.

use std::borrow::Cow;
use std::fmt::{self, Write as _};
use std::fs::File;
use std::io::{self, Read as _, Write as _};
use std::os::fd::AsFd;
use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::Path;

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

/// The most a file of one kind may hold, and what it is called in the refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    /// The size limit, bytes.
    pub bytes: u64,
    /// What the file is, for the message (`a ladder`).
    pub what: &'static str,
}

impl Limit {
    /// At most `bytes` of `what`.
    pub const fn new(bytes: u64, what: &'static str) -> Limit {
        Limit { bytes, what }
    }
}

const MIB: u64 = 1 << 20;

/// Ladders: the shipped ones are under 8 KiB.
pub const LADDER: Limit = Limit::new(MIB, "a ladder");
/// Package manifests.
pub const MANIFEST: Limit = Limit::new(16 * MIB, "a manifest");
/// Choice files.
pub const CHOICE: Limit = Limit::new(16 * MIB, "a choice");
/// Cache entries (choices).
pub const CACHE_ENTRY: Limit = Limit::new(16 * MIB, "a cache entry");
/// Cubins in a package: the largest compiled kernel is a few hundred KiB.
pub const CUBIN: Limit = Limit::new(64 * MIB, "a cubin");
/// NCCL id files written by this tool: a header line and the 128-byte id.
pub const ID_FILE: Limit = Limit::new(4096, "an id file");

impl fmt::Display for Limit {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.bytes >= MIB && self.bytes % MIB == 0 {
            write!(formatter, "{} MiB", self.bytes / MIB)
        } else if self.bytes >= 1024 && self.bytes % 1024 == 0 {
            write!(formatter, "{} KiB", self.bytes / 1024)
        } else {
            write!(formatter, "{} bytes", self.bytes)
        }
    }
}

/// Reads the file at `path` whole: refused (with an error of kind `InvalidInput` that says
/// why) when it is not a regular file or holds more than `limit`.
pub fn read_limited(path: &Path, limit: Limit) -> io::Result<Vec<u8>> {
    // Non-blocking, so that opening a FIFO with no writer returns at once; the handle is then
    // refused for not being a regular file before anything is read from it.
    let file = File::options()
        .read(true)
        .custom_flags((OFlag::O_NONBLOCK | OFlag::O_NOCTTY).bits())
        .open(path)?;
    read_opened(file, limit)
}

/// Opens the directory at `path` (links followed) without blocking: a FIFO, a device or a file
/// there is refused at once (`Not a directory`) instead of being opened as one, so that a FIFO
/// without a writer cannot hold the tool.
pub fn open_directory(path: &Path) -> io::Result<File> {
    let directory = File::options()
        .read(true)
        .custom_flags((OFlag::O_DIRECTORY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY).bits())
        .open(path)?;
    if !directory.metadata()?.is_dir() {
        return Err(io::Error::from(io::ErrorKind::NotADirectory));
    }
    Ok(directory)
}

/// Reads the file `name` in the directory open as `directory` (relative to that handle, so a
/// directory renamed meanwhile is still the one read), as [`read_limited`] does. Links are not
/// followed.
pub fn read_limited_at(directory: impl AsFd, name: &Path, limit: Limit) -> io::Result<Vec<u8>> {
    let descriptor = nix::fcntl::openat(
        directory,
        name,
        OFlag::O_RDONLY
            | OFlag::O_NONBLOCK
            | OFlag::O_NOCTTY
            | OFlag::O_NOFOLLOW
            | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(io::Error::from)?;
    read_opened(File::from(descriptor), limit)
}

fn read_opened(file: File, limit: Limit) -> io::Result<Vec<u8>> {
    let metadata = file.metadata()?;
    let file_type = metadata.file_type();
    if !file_type.is_file() {
        let kind = if file_type.is_fifo() {
            "a FIFO"
        } else if file_type.is_char_device() || file_type.is_block_device() {
            "a device"
        } else if file_type.is_socket() {
            "a socket"
        } else if file_type.is_dir() {
            "a directory"
        } else {
            "a special file"
        };
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("not a regular file: it is {kind}"),
        ));
    }
    let too_large = |size: String| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{size} is more than {} may hold ({limit})", limit.what),
        )
    };
    if metadata.len() > limit.bytes {
        return Err(too_large(format!("its size, {} bytes,", metadata.len())));
    }
    // The file may grow between the stat and the read: one byte past the limit says so.
    let capacity = usize::try_from(metadata.len()).unwrap_or(0);
    let mut bytes = Vec::with_capacity(capacity);
    file.take(limit.bytes.saturating_add(1))
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit.bytes {
        return Err(too_large("what it holds".to_owned()));
    }
    Ok(bytes)
}

/// The first line of every id file this tool writes; a file without it is never removed or
/// replaced.
pub const ID_FILE_HEADER: &[u8] = b"prepare rendezvous id, format 1\n";

/// An id file's bytes: the header line, then the id.
pub fn encode_id_file(id: &[u8]) -> Vec<u8> {
    let mut bytes = ID_FILE_HEADER.to_vec();
    bytes.extend_from_slice(id);
    bytes
}

/// The id in an id file this tool wrote; `None` for any other content.
pub fn decode_id_file(bytes: &[u8]) -> Option<&[u8]> {
    bytes.strip_prefix(ID_FILE_HEADER)
}

/// Checks that `path` may be replaced or removed as an id file: it is absent, or it is a regular
/// file holding what this tool writes there. Anything else is a user's and is refused.
pub fn check_id_file_ours(path: &Path) -> io::Result<bool> {
    match read_limited(path, ID_FILE) {
        Ok(bytes) if decode_id_file(&bytes).is_some() => Ok(true),
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "it is not an id file prepare wrote (it lacks its header line), so it is left as it \
             is; name a new file or remove it yourself",
        )),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(error) => Err(error),
    }
}

/// Removes an id file an earlier run wrote at `path`; nothing there is fine, and anything but
/// an id file this tool wrote is refused and kept.
pub fn remove_id_file(path: &Path) -> io::Result<()> {
    if check_id_file_ours(path)? {
        match std::fs::remove_file(path) {
            Err(error) if error.kind() != io::ErrorKind::NotFound => return Err(error),
            _ => {}
        }
    }
    Ok(())
}

/// Text from a file made safe for a terminal: every control character but newline and tab is
/// written as a Rust escape (`\u{1b}`), so a file cannot move the cursor, retitle the window or
/// hide what is printed.
pub fn escape_control(text: &str) -> Cow<'_, str> {
    if !text
        .chars()
        .any(|character| character.is_control() && !matches!(character, '\n' | '\t'))
    {
        return Cow::Borrowed(text);
    }
    let mut escaped = String::with_capacity(text.len() + 16);
    for character in text.chars() {
        if character.is_control() && !matches!(character, '\n' | '\t') {
            escaped.extend(character.escape_unicode());
        } else {
            escaped.push(character);
        }
    }
    Cow::Owned(escaped)
}

/// JSON text made safe for a terminal as [`escape_control`] makes text, in JSON's own syntax
/// (`\u007f`): serializers escape the control characters JSON requires them to (below U+0020),
/// not DEL and the C1 controls, and a raw control character in JSON text can only be inside a
/// string, where this escape means the same character.
pub fn escape_control_json(json: &str) -> Cow<'_, str> {
    if !json
        .chars()
        .any(|character| character.is_control() && !matches!(character, '\n' | '\t'))
    {
        return Cow::Borrowed(json);
    }
    let mut escaped = String::with_capacity(json.len() + 16);
    for character in json.chars() {
        if character.is_control() && !matches!(character, '\n' | '\t') {
            // Every control character is in the Basic Multilingual Plane: one escape each.
            let _ = write!(escaped, "\\u{:04x}", u32::from(character));
        } else {
            escaped.push(character);
        }
    }
    Cow::Owned(escaped)
}

/// The most characters of one value (a name, an id, a key, a number as given) that an error or
/// a diagnostic quotes; [`shorten`] cuts longer ones.
pub const QUOTED_CHARS: usize = 120;

/// A value a user gave, shortened for an error or a diagnostic: up to [`QUOTED_CHARS`]
/// characters it is kept whole; a longer one keeps its beginning and its end around `…`, so that
/// a line stays readable and still shows how the value starts and ends. Cuts fall between
/// characters and never inside an escape (`\"`, `\u001b`, `\u{1b}`, a JSON pointer's `~1`), so
/// text already escaped stays well formed.
pub fn shorten(text: &str) -> Cow<'_, str> {
    if text.chars().count() <= QUOTED_CHARS {
        return Cow::Borrowed(text);
    }
    // Where each unit (a character, or a whole escape) starts, and its length in characters.
    let mut units: Vec<(usize, usize)> = Vec::new();
    let mut at = 0;
    while at < text.len() {
        let (bytes, characters) = unit_at(&text[at..]);
        units.push((at, characters));
        at += bytes;
    }
    let head_budget = (QUOTED_CHARS - 1) / 2;
    let tail_budget = QUOTED_CHARS - 1 - head_budget;
    let fitting = |units: &mut dyn Iterator<Item = &(usize, usize)>, budget: usize| {
        let mut used = 0;
        units
            .take_while(|&&(_, length)| {
                used += length;
                used <= budget
            })
            .count()
    };
    let head_units = fitting(&mut units.iter(), head_budget);
    let tail_units = fitting(&mut units[head_units..].iter().rev(), tail_budget);
    let head_end = units[head_units].0;
    let tail_start = units
        .get(units.len() - tail_units)
        .map_or(text.len(), |&(start, _)| start);
    Cow::Owned(format!("{}…{}", &text[..head_end], &text[tail_start..]))
}

/// A value from the command line (a flag's value, an argument) as an error quotes it: escaped
/// for the terminal ([`escape_control`]) and shortened ([`shorten`]), so that a huge or hostile
/// argument still gives one readable line.
pub fn quoted(text: &str) -> String {
    shorten(&escape_control(text)).into_owned()
}

/// The length of the unit `rest` starts with, in bytes and in characters: an escape
/// (backslash escapes of JSON and of Rust, a JSON pointer's `~0` and `~1`) is one unit.
fn unit_at(rest: &str) -> (usize, usize) {
    let ascii = |length: usize| (length, length);
    if let Some(after) = rest.strip_prefix('\\') {
        if let Some(braced) = after.strip_prefix("u{") {
            if let Some(close) = braced.find('}').filter(|&close| close <= 6) {
                return ascii(close + 4);
            }
        }
        if let Some(digits) = after.strip_prefix('u') {
            if digits.len() >= 4 && digits.as_bytes()[..4].iter().all(u8::is_ascii_hexdigit) {
                return ascii(6);
            }
        }
        if let Some(next) = after.chars().next() {
            return (1 + next.len_utf8(), 2);
        }
    }
    if let Some(after) = rest.strip_prefix('~') {
        if after.starts_with(['0', '1']) {
            return ascii(2);
        }
    }
    (rest.chars().next().map_or(1, char::len_utf8), 1)
}

/// Checks that files can be made in `dir` (or in the directory that would hold it, when it
/// does not exist yet): a directory the process may write and enter.
pub fn check_writable_directory(dir: &Path) -> io::Result<()> {
    let mut existing = dir;
    loop {
        match std::fs::metadata(existing) {
            Ok(metadata) if metadata.is_dir() => break,
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{} is not a directory", existing.display()),
                ))
            }
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                existing = match existing.parent() {
                    Some(parent) if !parent.as_os_str().is_empty() => parent,
                    _ => Path::new("."),
                };
            }
            Err(error) => return Err(error),
        }
    }
    nix::unistd::access(
        existing,
        nix::unistd::AccessFlags::W_OK | nix::unistd::AccessFlags::X_OK,
    )
    .map_err(|errno| {
        io::Error::new(
            io::Error::from(errno).kind(),
            format!("{} is not writable: {errno}", existing.display()),
        )
    })
}

/// Writes `bytes` to `path` through a synced temporary file in the same directory and a rename.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    let mut file = tempfile::NamedTempFile::new_in(dir)?;
    // A temporary file is private to its owner; what is written here (choices, cache entries,
    // reports, plots) is meant to be read like any other file.
    file.as_file()
        .set_permissions(std::fs::Permissions::from_mode(0o644))?;
    file.write_all(bytes)?;
    file.as_file().sync_all()?;
    file.persist(path).map_err(|error| error.error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_read_as_sizes() {
        assert_eq!(LADDER.to_string(), "1 MiB");
        assert_eq!(MANIFEST.to_string(), "16 MiB");
        assert_eq!(ID_FILE.to_string(), "4 KiB");
        assert_eq!(Limit::new(100, "x").to_string(), "100 bytes");
    }

    #[test]
    fn reads_a_regular_file_up_to_its_limit_and_no_further() {
        let scratch = tempfile::tempdir().unwrap();
        let path = scratch.path().join("file");
        let limit = Limit::new(4, "a test file");
        std::fs::write(&path, b"four").unwrap();
        assert_eq!(read_limited(&path, limit).unwrap(), b"four");
        std::fs::write(&path, b"fives").unwrap();
        let error = read_limited(&path, limit).unwrap_err();
        assert_eq!(
            error.to_string(),
            "its size, 5 bytes, is more than a test file may hold (4 bytes)"
        );
        let directory = File::open(scratch.path()).unwrap();
        assert_eq!(
            read_limited_at(&directory, Path::new("file"), limit)
                .unwrap_err()
                .kind(),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(
            read_limited_at(&directory, Path::new("missing"), limit)
                .unwrap_err()
                .kind(),
            io::ErrorKind::NotFound
        );
    }

    #[test]
    fn refuses_directories_devices_and_links_at() {
        let scratch = tempfile::tempdir().unwrap();
        let error = read_limited(scratch.path(), LADDER).unwrap_err();
        assert_eq!(error.to_string(), "not a regular file: it is a directory");
        let error = read_limited(Path::new("/dev/null"), LADDER).unwrap_err();
        assert_eq!(error.to_string(), "not a regular file: it is a device");
        std::fs::write(scratch.path().join("target"), b"x").unwrap();
        std::os::unix::fs::symlink("target", scratch.path().join("link")).unwrap();
        let directory = File::open(scratch.path()).unwrap();
        assert!(read_limited_at(&directory, Path::new("link"), LADDER).is_err());
        assert_eq!(
            read_limited(&scratch.path().join("link"), LADDER).unwrap(),
            b"x"
        );
    }

    #[test]
    fn only_a_directory_opens_as_one() {
        let scratch = tempfile::tempdir().unwrap();
        assert!(open_directory(scratch.path())
            .unwrap()
            .metadata()
            .unwrap()
            .is_dir());
        let file = scratch.path().join("file");
        std::fs::write(&file, b"").unwrap();
        for path in [file.as_path(), Path::new("/dev/null")] {
            let error = open_directory(path).unwrap_err();
            assert_eq!(error.kind(), io::ErrorKind::NotADirectory, "{error}");
        }
    }

    #[test]
    fn only_an_id_file_this_tool_wrote_is_removed() {
        let scratch = tempfile::tempdir().unwrap();
        let path = scratch.path().join("id");
        remove_id_file(&path).unwrap();
        std::fs::write(&path, encode_id_file(&[7; 128])).unwrap();
        assert_eq!(
            decode_id_file(&std::fs::read(&path).unwrap()),
            Some(&[7; 128][..])
        );
        remove_id_file(&path).unwrap();
        assert!(!path.exists());
        for foreign in [&b"notes"[..], &[7; 128][..], b""] {
            std::fs::write(&path, foreign).unwrap();
            let error = remove_id_file(&path).unwrap_err();
            assert_eq!(error.kind(), io::ErrorKind::InvalidInput, "{error}");
            assert_eq!(std::fs::read(&path).unwrap(), foreign);
        }
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        assert!(remove_id_file(&path).is_err());
        assert!(path.is_dir());
    }

    #[test]
    fn escapes_every_control_character_but_newline_and_tab() {
        assert!(matches!(escape_control("plain\n\ttext"), Cow::Borrowed(_)));
        assert_eq!(
            escape_control("a\u{1b}[2Jb\u{7}c\r\u{9b}d\u{7f}"),
            "a\\u{1b}[2Jb\\u{7}c\\u{d}\\u{9b}d\\u{7f}"
        );
    }

    #[test]
    fn json_keeps_its_syntax_when_escaped() {
        let value = serde_json::json!({ "name": "a\u{1b}b\u{7f}c\u{9b}d\re\tf\ng" });
        let text = serde_json::to_string_pretty(&value).unwrap();
        let escaped = escape_control_json(&text);
        assert!(!escaped
            .chars()
            .any(|character| character.is_control() && character != '\n'));
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&escaped).unwrap(),
            value
        );
        assert!(escaped.contains(r"b\u007fc\u009bd"), "{escaped}");
        assert!(matches!(escape_control_json("{}"), Cow::Borrowed(_)));
    }

    #[test]
    fn long_values_keep_their_ends_around_an_ellipsis() {
        let short = "x".repeat(QUOTED_CHARS);
        assert!(matches!(shorten(&short), Cow::Borrowed(_)));
        let long = format!("start{}end", "é".repeat(100_000));
        let shortened = shorten(&long);
        assert_eq!(shortened.chars().count(), QUOTED_CHARS);
        assert!(shortened.starts_with("startéé") && shortened.ends_with("éend"));
        assert_eq!(shortened.matches('…').count(), 1);
    }

    #[test]
    fn no_escape_is_cut() {
        for escape in [r#"\""#, r"\u001b", r"\u{1b}", r"\\", "~1"] {
            let text = escape.repeat(QUOTED_CHARS);
            let shortened = shorten(&text);
            let (head, tail) = shortened.split_once('…').unwrap();
            assert!(shortened.chars().count() <= QUOTED_CHARS, "{shortened}");
            assert!(head.len() > QUOTED_CHARS / 3, "{shortened}");
            for part in [head, tail] {
                assert_eq!(part.len() % escape.len(), 0, "{escape}: {shortened}");
                assert_eq!(part, escape.repeat(part.len() / escape.len()));
            }
        }
        // A JSON string shortened stays a JSON string.
        let json = serde_json::Value::String("\u{1b}\"".repeat(100)).to_string();
        let shortened = shorten(&json);
        assert!(
            serde_json::from_str::<String>(&shortened).is_ok(),
            "{shortened}"
        );
    }

    #[test]
    fn a_file_or_a_missing_parent_under_one_is_not_writable() {
        let scratch = tempfile::tempdir().unwrap();
        check_writable_directory(scratch.path()).unwrap();
        check_writable_directory(&scratch.path().join("new/deeper")).unwrap();
        let file = scratch.path().join("file");
        std::fs::write(&file, b"").unwrap();
        assert!(check_writable_directory(&file).is_err());
        assert!(check_writable_directory(&file.join("below")).is_err());
    }
}
