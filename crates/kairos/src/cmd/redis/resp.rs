//! RESP, the Redis serialization protocol: parsing client commands (RESP2 and inline) and
//! encoding replies in RESP2 or, after `HELLO 3`, RESP3 (which differs for the replies the
//! gateway sends only in nil, `_`, and maps, `%`).
//!
//! Hand-written rather than taken from a crate: the gateway needs only the client half of
//! RESP2 (a command is an array of bulk strings, or an inline line), and it needs every limit
//! checked *before* memory is committed — a declared bulk length of 2^40 or an array of a
//! billion elements must be refused from its header, never allocated. The small parsers on
//! crates.io either allocate from declared lengths, parse all RESP3 types a server never
//! receives, or are tied to a client library; a 150-line parser whose every limit is visible
//! is easier to trust.
//!
//! [`parse_command`] looks at the front of a buffer and returns a complete command, "need more
//! bytes", or a [`ProtocolError`] (the connection answers `-ERR Protocol error: …` and closes,
//! as Redis does). Limits ([`Limits`]): bulk length (Redis's `proto-max-bulk-len`, 512 MiB,
//! configurable lower), array length (1,048,576 arguments) and inline command length (64 KiB).
//! Inline commands are split on spaces without Redis's quote handling, and end at LF with or
//! without CR before it, as in Redis (`printf 'PING\n' | nc`); array and bulk headers need CRLF.

use thiserror::Error;

/// What a client may send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest bulk string (one argument), bytes.
    pub bulk_bytes_max: usize,
    /// Most arguments in one command.
    pub array_len_max: usize,
    /// Longest inline command or array / bulk header line, bytes.
    pub inline_bytes_max: usize,
}

/// Redis's own bulk limit (`proto-max-bulk-len`).
pub const BULK_BYTES_MAX: usize = 512 << 20;

impl Default for Limits {
    fn default() -> Self {
        Limits { bulk_bytes_max: BULK_BYTES_MAX, array_len_max: 1 << 20, inline_bytes_max: 64 << 10 }
    }
}

/// A malformed request; the message follows `-ERR Protocol error: ` as in Redis.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum ProtocolError {
    #[error("invalid multibulk length")]
    ArrayLength,
    #[error("invalid bulk length")]
    BulkLength,
    #[error("expected '$', got '{0}'")]
    ExpectedBulk(char),
    #[error("too big inline request")]
    InlineTooBig,
    #[error("too big mbulk count string")]
    HeaderTooBig,
    #[error("bulk string not followed by CRLF")]
    MissingCrlf,
}

/// A command: its arguments (the first is the name).
pub type Args = Vec<Vec<u8>>;

/// The line at the front of `buf` without its CRLF, and the bytes it takes with it.
fn line(buf: &[u8], max: usize, too_big: ProtocolError) -> Result<Option<(&[u8], usize)>, ProtocolError> {
    let window = &buf[..buf.len().min(max + 2)];
    match window.windows(2).position(|w| w == b"\r\n") {
        Some(i) => Ok(Some((&buf[..i], i + 2))),
        None if buf.len() > max => Err(too_big),
        None => Ok(None),
    }
}

/// An inline command's line: up to LF, without the CR before it if there is one.
fn inline_line(buf: &[u8], max: usize) -> Result<Option<(&[u8], usize)>, ProtocolError> {
    let window = &buf[..buf.len().min(max + 2)];
    match window.iter().position(|b| *b == b'\n') {
        Some(i) => Ok(Some((buf[..i].strip_suffix(b"\r").unwrap_or(&buf[..i]), i + 1))),
        None if buf.len() > max => Err(ProtocolError::InlineTooBig),
        None => Ok(None),
    }
}

fn int(digits: &[u8]) -> Option<i64> {
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// How far the command at the front of a buffer has been checked while it arrives in pieces:
/// [`parse_command`] resumes there, so a command is scanned once however many reads it
/// takes (a review sent 100,000 one-byte arguments in 4 KiB reads: each read re-parsed and
/// re-copied every argument before it, about 8.6 million allocations for one 700 KB command).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Scan {
    /// The array's arguments once its header is read: where the first starts, how many there
    /// are, how many are checked whole, and where the next to check starts.
    array: Option<ArrayScan>,
    /// Bytes looked at, over all calls (the tests hold it to about the commands' length).
    pub bytes_scanned: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ArrayScan {
    first_arg: usize,
    count: u64,
    checked: u64,
    next: usize,
}

/// Parses one command from the front of `buf`: `Ok(Some((args, bytes used)))` (args may be
/// empty: an empty line or a `*0` array, which callers skip), `Ok(None)` if the command is not
/// complete yet, or the protocol error. It resumes from `scan`, which the caller keeps with the
/// buffer (a complete command leaves it fresh for the next): arguments are checked
/// once as they arrive and copied once, when the command is whole.
pub fn parse_command(buf: &[u8], limits: &Limits, scan: &mut Scan) -> Result<Option<(Args, usize)>, ProtocolError> {
    let Some(&first) = buf.first() else { return Ok(None) };
    if first != b'*' {
        // At most `inline_bytes_max` to look at, again on each read: bounded.
        let Some((l, used)) = inline_line(buf, limits.inline_bytes_max)? else {
            scan.bytes_scanned += buf.len().min(limits.inline_bytes_max + 2);
            return Ok(None);
        };
        scan.bytes_scanned += used;
        let args = l.split(|b| *b == b' ' || *b == b'\t').filter(|a| !a.is_empty()).map(<[u8]>::to_vec).collect();
        return Ok(Some((args, used)));
    }
    let mut a = match scan.array {
        Some(a) => a,
        None => {
            let Some((count, first_arg)) = array_len(buf, limits)? else { return Ok(None) };
            scan.bytes_scanned += first_arg;
            if count == 0 {
                return Ok(Some((Vec::new(), first_arg)));
            }
            ArrayScan { first_arg, count, checked: 0, next: first_arg }
        }
    };
    // Check the arguments not checked yet, up to the first that has not fully arrived.
    while a.checked < a.count {
        let Some((_, end)) = bulk_at(buf, a.next, limits)? else {
            scan.array = Some(a);
            return Ok(None);
        };
        scan.bytes_scanned += end + 2 - a.next;
        a.checked += 1;
        a.next = end + 2;
    }
    // Whole: copy the arguments out in one pass.
    scan.array = None;
    let mut args = Vec::with_capacity(a.count as usize);
    let mut pos = a.first_arg;
    for _ in 0..a.count {
        let Some((start, end)) = bulk_at(buf, pos, limits)? else { break }; // checked above
        args.push(buf[start..end].to_vec());
        pos = end + 2;
    }
    Ok(Some((args, a.next)))
}

/// The array header at the front of `buf` (`*<n>`): its count and the bytes it takes.
fn array_len(buf: &[u8], limits: &Limits) -> Result<Option<(u64, usize)>, ProtocolError> {
    let Some((header, used)) = line(&buf[1..], 32, ProtocolError::HeaderTooBig)? else { return Ok(None) };
    let n = int(header).ok_or(ProtocolError::ArrayLength)?;
    if n > 0 && n as u64 > limits.array_len_max as u64 {
        return Err(ProtocolError::ArrayLength);
    }
    Ok(Some((n.max(0) as u64, used + 1)))
}

/// The bulk string at `pos` (`$<len>\r\n<bytes>\r\n`): where its bytes start and end, or
/// `None` if it has not fully arrived.
fn bulk_at(buf: &[u8], pos: usize, limits: &Limits) -> Result<Option<(usize, usize)>, ProtocolError> {
    let Some(&b) = buf.get(pos) else { return Ok(None) };
    if b != b'$' {
        return Err(ProtocolError::ExpectedBulk(b as char));
    }
    let Some((header, used)) = line(&buf[pos + 1..], 32, ProtocolError::BulkLength)? else { return Ok(None) };
    let len = int(header).ok_or(ProtocolError::BulkLength)?;
    if len < 0 || len as u64 > limits.bulk_bytes_max as u64 {
        return Err(ProtocolError::BulkLength);
    }
    let start = pos + 1 + used;
    let end = start + len as usize;
    if buf.len() < end + 2 {
        return Ok(None);
    }
    if &buf[end..end + 2] != b"\r\n" {
        return Err(ProtocolError::MissingCrlf);
    }
    Ok(Some((start, end)))
}

/// A reply, as RESP2 encodes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    Simple(String),
    /// An error line, e.g. `ERR unknown command`: the first word is the error kind.
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    Nil,
    Array(Vec<Reply>),
    /// Key-value pairs: a flat array in RESP2, a map in RESP3.
    Map(Vec<(Reply, Reply)>),
}

impl Reply {
    pub fn ok() -> Self {
        Reply::Simple("OK".into())
    }
    pub fn err(msg: impl Into<String>) -> Self {
        Reply::Error(msg.into())
    }
    pub fn bulk(s: impl AsRef<[u8]>) -> Self {
        Reply::Bulk(s.as_ref().to_vec())
    }
}

/// Simple strings and errors are one line: CR and LF become spaces.
fn one_line(s: &str, out: &mut Vec<u8>) {
    out.extend(s.bytes().map(|b| if b == b'\r' || b == b'\n' { b' ' } else { b }));
}

/// Appends `reply`'s encoding to `out`: RESP3 if `resp3`, else RESP2.
pub fn encode_as(resp3: bool, reply: &Reply, out: &mut Vec<u8>) {
    match reply {
        Reply::Simple(s) => {
            out.push(b'+');
            one_line(s, out);
        }
        Reply::Error(s) => {
            out.push(b'-');
            one_line(s, out);
        }
        Reply::Int(n) => out.extend_from_slice(format!(":{n}").as_bytes()),
        Reply::Bulk(b) => {
            out.extend_from_slice(format!("${}\r\n", b.len()).as_bytes());
            out.extend_from_slice(b);
        }
        Reply::Nil if resp3 => out.push(b'_'),
        Reply::Nil => out.extend_from_slice(b"$-1"),
        Reply::Array(items) => {
            out.extend_from_slice(format!("*{}\r\n", items.len()).as_bytes());
            for item in items {
                encode_as(resp3, item, out);
            }
            return;
        }
        Reply::Map(pairs) => {
            let header = if resp3 { format!("%{}\r\n", pairs.len()) } else { format!("*{}\r\n", 2 * pairs.len()) };
            out.extend_from_slice(header.as_bytes());
            for (k, v) in pairs {
                encode_as(resp3, k, out);
                encode_as(resp3, v, out);
            }
            return;
        }
    }
    out.extend_from_slice(b"\r\n");
}

/// Arrays nested deeper than this in a reply are refused ([`read_reply`] recurses per level).
pub const REPLY_DEPTH_MAX: usize = 32;

/// Reads one RESP2 reply (what [`encode_as`] writes without `resp3`) from a server: the
/// client side of `kairos cluster bench`, which needs nothing more than these shapes. Bulk
/// strings and arrays are bounded by `limits`, nesting by [`REPLY_DEPTH_MAX`].
pub fn read_reply(r: &mut impl std::io::BufRead, limits: &Limits) -> std::io::Result<Reply> {
    read_reply_nested(r, limits, 0)
}

fn read_reply_nested(r: &mut impl std::io::BufRead, limits: &Limits, depth: usize) -> std::io::Result<Reply> {
    let bad = |what: String| std::io::Error::new(std::io::ErrorKind::InvalidData, what);
    let mut line = Vec::new();
    if r.read_until(b'\n', &mut line)? == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    let line = line.strip_suffix(b"\r\n").unwrap_or(&line);
    // The type byte, then the rest as text (a byte, not a character: the line may be anything).
    let (kind, rest) = line.split_at(line.len().min(1));
    let text = String::from_utf8_lossy(line);
    let rest = String::from_utf8_lossy(rest);
    let number = |max: usize| -> std::io::Result<i64> {
        let n: i64 = rest.parse().map_err(|_| bad(format!("not a length or integer: {text:?}")))?;
        if n > max as i64 {
            return Err(bad(format!("{text:?} is beyond the limit of {max}")));
        }
        Ok(n)
    };
    Ok(match kind {
        b"+" => Reply::Simple(rest.into_owned()),
        b"-" => Reply::Error(rest.into_owned()),
        b":" => Reply::Int(number(usize::MAX >> 1)?),
        b"$" => match number(limits.bulk_bytes_max)? {
            n if n < 0 => Reply::Nil,
            n => {
                let mut data = vec![0; n as usize + 2];
                r.read_exact(&mut data)?;
                data.truncate(n as usize);
                Reply::Bulk(data)
            }
        },
        b"*" if depth >= REPLY_DEPTH_MAX => {
            return Err(bad(format!("arrays nested deeper than {REPLY_DEPTH_MAX} levels")))
        }
        b"*" => match number(limits.array_len_max)? {
            n if n < 0 => Reply::Nil,
            n => Reply::Array((0..n).map(|_| read_reply_nested(r, limits, depth + 1)).collect::<std::io::Result<_>>()?),
        },
        _ => return Err(bad(format!("not a RESP2 reply: {text:?}"))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A review's input: Redis ends an inline command at a bare LF too (`printf 'PING\n' | nc`);
    /// the gateway waited for CRLF until its partial-command timeout.
    #[test]
    fn an_inline_command_ended_by_a_bare_lf_is_complete() {
        assert_eq!(parse(b"PING\n"), Ok(Some((vec![b"PING".to_vec()], 5))));
        assert_eq!(parse(b"SET k v\nGET k\n"), Ok(Some((vec![b"SET".to_vec(), b"k".to_vec(), b"v".to_vec()], 8))));
        assert_eq!(parse(b"PING\r\n"), Ok(Some((vec![b"PING".to_vec()], 6))));
        assert_eq!(parse(b"PING"), Ok(None));
    }

    /// A review's input: one command of 100,000 one-byte arguments arriving in 4 KiB reads.
    /// Each read re-parsed (and copied) every argument before it; now scanning resumes where
    /// it stopped, so the bytes looked at stay about the command's length.
    #[test]
    fn a_command_arriving_in_pieces_is_scanned_once() {
        const ARGS: usize = 100_000;
        let mut cmd = format!("*{ARGS}\r\n").into_bytes();
        for _ in 0..ARGS {
            cmd.extend_from_slice(b"$1\r\nx\r\n");
        }
        cmd.extend_from_slice(b"PING\r\n"); // the next command, inline
        let (limits, mut scan) = (Limits::default(), Scan::default());
        let mut buf = Vec::new();
        let mut parsed = None;
        for chunk in cmd.chunks(4096) {
            buf.extend_from_slice(chunk);
            if parsed.is_none() {
                parsed = parse_command(&buf, &limits, &mut scan).unwrap();
            }
        }
        let (args, used) = parsed.expect("the whole command parses");
        assert_eq!((args.len(), used), (ARGS, cmd.len() - 6));
        assert!(scan.bytes_scanned <= used + 4096, "{} bytes scanned for {used}", scan.bytes_scanned);
        let next = parse_command(&buf[used..], &limits, &mut scan).unwrap();
        assert_eq!(next, Some((vec![b"PING".to_vec()], 6)));
    }

    #[test]
    fn replies_read_back_as_encoded() {
        let r = Reply::Array(vec![Reply::ok(), Reply::Int(-3), Reply::bulk("a\r\nb"), Reply::Nil, Reply::err("ERR x")]);
        let mut out = Vec::new();
        encode_as(false, &r, &mut out);
        encode_as(false, &Reply::Int(7), &mut out);
        let mut input = &out[..];
        assert_eq!(read_reply(&mut input, &Limits::default()).unwrap(), r);
        assert_eq!(read_reply(&mut input, &Limits::default()).unwrap(), Reply::Int(7));
        assert!(read_reply(&mut input, &Limits::default()).is_err(), "end of input");
        assert!(read_reply(&mut &b"$1099511627776\r\n"[..], &Limits::default()).is_err());
        assert!(read_reply(&mut &b"?\r\n"[..], &Limits::default()).is_err());
    }

    fn parse(b: &[u8]) -> Result<Option<(Args, usize)>, ProtocolError> {
        parse_command(b, &Limits::default(), &mut Scan::default())
    }

    #[test]
    fn arrays_inline_and_partial_input() {
        let cmd = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nhello\r\n";
        let (args, used) = parse(cmd).unwrap().unwrap();
        assert_eq!(args, vec![b"SET".to_vec(), b"k".to_vec(), b"hello".to_vec()]);
        assert_eq!(used, cmd.len());
        for cut in 0..cmd.len() {
            assert_eq!(parse(&cmd[..cut]).unwrap(), None, "prefix of {cut} bytes");
        }
        let (args, used) = parse(b"PING  hi\r\nGET").unwrap().unwrap();
        assert_eq!((args, used), (vec![b"PING".to_vec(), b"hi".to_vec()], 10));
        assert_eq!(parse(b"*0\r\n").unwrap(), Some((vec![], 4)));
        assert_eq!(parse(b"\r\n").unwrap(), Some((vec![], 2)));
        // Binary-safe bulk strings.
        let (args, _) = parse(b"*1\r\n$4\r\na\r\nb\r\n").unwrap().unwrap();
        assert_eq!(args, vec![b"a\r\nb".to_vec()]);
    }

    #[test]
    fn limits_are_checked_from_the_headers() {
        assert_eq!(parse(b"*1\r\n$1099511627776\r\n"), Err(ProtocolError::BulkLength));
        assert_eq!(parse(b"*1\r\n$-5\r\n"), Err(ProtocolError::BulkLength));
        assert_eq!(parse(b"*2000000\r\n"), Err(ProtocolError::ArrayLength));
        assert_eq!(parse(b"*x\r\n"), Err(ProtocolError::ArrayLength));
        assert_eq!(parse(b"*1\r\n:5\r\n"), Err(ProtocolError::ExpectedBulk(':')));
        assert_eq!(parse(b"*1\r\n$1\r\nab\r\n"), Err(ProtocolError::MissingCrlf));
        assert_eq!(parse(&[b'*'; 100]), Err(ProtocolError::HeaderTooBig));
        let long = vec![b'a'; 70_000];
        assert_eq!(parse(&long), Err(ProtocolError::InlineTooBig));
        let small = Limits { bulk_bytes_max: 4, ..Limits::default() };
        assert_eq!(parse_command(b"*1\r\n$5\r\n", &small, &mut Scan::default()), Err(ProtocolError::BulkLength));
    }

    #[test]
    fn replies_encode_as_resp2() {
        let mut out = Vec::new();
        let r = Reply::Array(vec![
            Reply::ok(),
            Reply::Int(-3),
            Reply::bulk("hi"),
            Reply::Nil,
            Reply::err("ERR bad\r\nthing"),
        ]);
        encode_as(false, &r, &mut out);
        assert_eq!(out, b"*5\r\n+OK\r\n:-3\r\n$2\r\nhi\r\n$-1\r\n-ERR bad  thing\r\n".to_vec());
        let m = Reply::Map(vec![(Reply::bulk("proto"), Reply::Int(3)), (Reply::bulk("x"), Reply::Nil)]);
        let mut out = Vec::new();
        encode_as(true, &m, &mut out);
        assert_eq!(out, b"%2\r\n$5\r\nproto\r\n:3\r\n$1\r\nx\r\n_\r\n".to_vec());
        out.clear();
        encode_as(false, &m, &mut out);
        assert_eq!(out, b"*4\r\n$5\r\nproto\r\n:3\r\n$1\r\nx\r\n$-1\r\n".to_vec());
    }

    /// A command as redis-cli sends it: an array of bulk strings.
    fn encode_command(args: &[Vec<u8>]) -> Vec<u8> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a);
            out.extend_from_slice(b"\r\n");
        }
        out
    }

    #[test]
    fn a_reply_line_starting_with_a_wide_character_is_an_error() {
        // The type "byte" of this line is the first byte of a 3-byte character.
        assert!(read_reply(&mut "€5\r\n".as_bytes(), &Limits::default()).is_err());
        assert!(read_reply(&mut &[0xff, b'\r', b'\n'][..], &Limits::default()).is_err());
    }

    #[test]
    fn replies_nested_too_deep_are_refused() {
        let nested = |depth: usize| {
            let mut b = "*1\r\n".repeat(depth).into_bytes();
            b.extend_from_slice(b":1\r\n");
            b
        };
        assert!(read_reply(&mut &nested(REPLY_DEPTH_MAX)[..], &Limits::default()).is_ok());
        assert!(read_reply(&mut &nested(REPLY_DEPTH_MAX + 1)[..], &Limits::default()).is_err());
        assert!(read_reply(&mut &nested(100_000)[..], &Limits::default()).is_err(), "no stack overflow");
    }

    proptest::proptest! {
        /// Whatever a client sends, the parser answers (a command, "more bytes", or an error)
        /// without panicking, and never claims more bytes than it was given.
        #[test]
        fn any_request_bytes_parse_or_fail_cleanly(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200),
        ) {
            let small = Limits { bulk_bytes_max: 16, array_len_max: 8, inline_bytes_max: 64 };
            for limits in [Limits::default(), small] {
                if let Ok(Some((_, used))) = parse_command(&bytes, &limits, &mut Scan::default()) {
                    proptest::prop_assert!(used > 0 && used <= bytes.len());
                }
            }
        }

        /// A command arrives in pieces: every strict prefix asks for more, the whole is parsed
        /// back to its arguments (binary-safe), and what follows it is left for the next.
        #[test]
        fn commands_parse_back_from_any_split(
            args in proptest::collection::vec(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..20), 1..6),
        ) {
            let bytes = encode_command(&args);
            for cut in 0..bytes.len() {
                proptest::prop_assert_eq!(parse(&bytes[..cut]), Ok(None));
            }
            let mut two = bytes.clone();
            two.extend_from_slice(b"*1\r\n$4\r\nPING\r\n");
            proptest::prop_assert_eq!(parse(&two), Ok(Some((args.clone(), bytes.len()))));
            // Arriving a byte at a time, resumed from where each try stopped: the same.
            let mut scan = Scan::default();
            for cut in 0..bytes.len() {
                proptest::prop_assert_eq!(parse_command(&two[..cut], &Limits::default(), &mut scan), Ok(None));
            }
            let whole = parse_command(&two[..bytes.len()], &Limits::default(), &mut scan);
            proptest::prop_assert_eq!(whole, Ok(Some((args, bytes.len()))));
        }

        /// Whatever a server sends back, the client's reader answers without panicking.
        #[test]
        fn any_reply_bytes_read_or_fail_cleanly(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200),
        ) {
            let small = Limits { bulk_bytes_max: 16, array_len_max: 8, inline_bytes_max: 64 };
            let _ = read_reply(&mut &bytes[..], &small);
            let _ = read_reply(&mut &bytes[..], &Limits::default());
        }
    }
}
