//! The MongoDB wire protocol: message header, OP_MSG (and OP_QUERY / OP_REPLY for the legacy
//! handshake), parsed into one command document and encoded back. Pure functions: the listener
//! in the `kairos` binary reads bytes, this module says what they mean.
//!
//! | message | what is accepted |
//! |---|---|
//! | header | `messageLength` (i32, includes the header) in `16 + 5 ..= MAX_MESSAGE_SIZE_BYTES`, `requestID`, `responseTo`, `opCode` |
//! | OP_MSG (2013) | `flagBits` (bit 0 checksumPresent, bit 1 moreToCome, bit 16 exhaustAllowed; any other bit of 0..16 is an error), one kind-0 body section, any number of kind-1 document sequences (merged into the body as arrays under their identifier), then the CRC-32C checksum if flagged (verified) |
//! | OP_QUERY (2004) | only on `<db>.$cmd` (drivers' first handshake): the query document is the command |
//! | anything else | [`WireError::UnsupportedOpCode`] |
//!
//! Every document is length-checked before it is parsed (at most
//! [`MAX_BSON_OBJECT_SIZE`] plus 16 KiB for the command envelope); every error is a
//! [`WireError`], never a panic.

use bson::Document;
use thiserror::Error;

/// `maxMessageSizeBytes` announced in `hello`, and the largest message accepted.
pub const MAX_MESSAGE_SIZE_BYTES: usize = 48_000_000;
/// `maxBsonObjectSize` announced in `hello`.
pub const MAX_BSON_OBJECT_SIZE: usize = 16 * 1024 * 1024;
/// A command document may exceed a user document by this much (MongoDB's allowance).
const COMMAND_ENVELOPE_BYTES: usize = 16 * 1024;
/// Header length.
pub const HEADER_LEN: usize = 16;

pub const OP_REPLY: i32 = 1;
pub const OP_QUERY: i32 = 2004;
pub const OP_COMPRESSED: i32 = 2012;
pub const OP_MSG: i32 = 2013;

const FLAG_CHECKSUM_PRESENT: u32 = 1;
const FLAG_MORE_TO_COME: u32 = 1 << 1;
const FLAG_EXHAUST_ALLOWED: u32 = 1 << 16;
/// Bits 0..16 are "required": a receiver must reject those it does not know.
const REQUIRED_BITS: u32 = 0xFFFF;

/// What was wrong with a message. The listener answers with an error reply when it can (the
/// frame was read whole) and closes the connection otherwise.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum WireError {
    #[error("message length {0} is outside 21..={MAX_MESSAGE_SIZE_BYTES} bytes")]
    BadLength(i64),
    #[error("opCode {0} is not supported (only OP_MSG, and OP_QUERY on <db>.$cmd)")]
    UnsupportedOpCode(i32),
    #[error("OP_MSG flag bits {0:#x} have an unknown required bit")]
    UnknownRequiredFlags(u32),
    #[error("message truncated: {0}")]
    Truncated(&'static str),
    #[error("OP_MSG checksum mismatch: the message says {claimed:#010x}, its bytes give {computed:#010x}")]
    ChecksumMismatch { claimed: u32, computed: u32 },
    #[error("OP_MSG has {0} body sections; exactly one is required")]
    BodyCount(usize),
    #[error("unknown OP_MSG section kind {0}")]
    UnknownSectionKind(u8),
    #[error("invalid BSON document: {0}")]
    InvalidBson(String),
    #[error("BSON document of {0} bytes is larger than allowed")]
    DocumentTooLarge(usize),
    #[error("document sequence `{0}` duplicates a field of the command body")]
    DuplicateSequence(String),
    #[error("OP_QUERY is only supported on <db>.$cmd, not on `{0}`")]
    LegacyQuery(String),
    #[error("invalid cstring: {0}")]
    BadCString(&'static str),
}

/// The 16-byte message header.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// Whole message length in bytes, header included.
    pub length: usize,
    pub request_id: i32,
    pub response_to: i32,
    pub op_code: i32,
}

/// A parsed request.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub request_id: i32,
    /// The command: the body with document sequences merged in (or the OP_QUERY query).
    pub command: Document,
    /// OP_MSG moreToCome: the client wants no reply.
    pub more_to_come: bool,
    /// OP_MSG exhaustAllowed (replies here never set moreToCome, so this changes nothing).
    pub exhaust_allowed: bool,
    /// The request came as OP_QUERY (answer with OP_REPLY).
    pub legacy: bool,
}

fn i32_at(b: &[u8], at: usize) -> Option<i32> {
    Some(i32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Parses and checks a header (the length is checked before anything is allocated).
pub fn parse_header(b: &[u8; HEADER_LEN]) -> Result<Header, WireError> {
    let length = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    if length < (HEADER_LEN + 5) as i32 || length as usize > MAX_MESSAGE_SIZE_BYTES {
        return Err(WireError::BadLength(i64::from(length)));
    }
    let field = |at: usize| i32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    Ok(Header { length: length as usize, request_id: field(4), response_to: field(8), op_code: field(12) })
}

/// How deeply a document may nest: MongoDB's default (`maxBSONDepth`, 200). Converting a
/// document recurses once per level, so a deeper one would overflow the stack (a review sent
/// 8 MB nested a million levels deep: the process aborted).
pub const MAX_BSON_DEPTH: usize = 200;

/// Decodes one whole BSON document (`bytes` is exactly it), refusing one nested deeper than
/// [`MAX_BSON_DEPTH`] before anything recurses over it. Every document from the network or a
/// peer's oplog goes through here.
pub fn decode_document(bytes: &[u8]) -> Result<Document, WireError> {
    let raw = bson::RawDocument::from_bytes(bytes).map_err(|e| WireError::InvalidBson(e.to_string()))?;
    check_depth(raw)?;
    Document::try_from(raw).map_err(|e| WireError::InvalidBson(e.to_string()))
}

/// Walks `doc` with a stack of its own (no recursion), refusing nesting past [`MAX_BSON_DEPTH`].
fn check_depth(doc: &bson::RawDocument) -> Result<(), WireError> {
    let invalid = |e: bson::raw::Error| WireError::InvalidBson(e.to_string());
    let mut stack = vec![doc.iter()];
    while let Some(top) = stack.last_mut() {
        let Some(element) = top.next() else {
            stack.pop();
            continue;
        };
        let inner = match element.map_err(invalid)?.1 {
            bson::RawBsonRef::Document(d) => d,
            bson::RawBsonRef::Array(a) => bson::RawDocument::from_bytes(a.as_bytes()).map_err(invalid)?,
            bson::RawBsonRef::JavaScriptCodeWithScope(c) => c.scope,
            _ => continue,
        };
        if stack.len() >= MAX_BSON_DEPTH {
            return Err(WireError::InvalidBson(format!("nested deeper than {MAX_BSON_DEPTH} levels")));
        }
        stack.push(inner.iter());
    }
    Ok(())
}

/// Reads one BSON document at the start of `b`, returning it and its length.
fn read_document(b: &[u8], max_len: usize) -> Result<(Document, usize), WireError> {
    let len = i32_at(b, 0).ok_or(WireError::Truncated("document length"))?;
    if len < 5 {
        return Err(WireError::InvalidBson(format!("document length {len} is below 5")));
    }
    let len = len as usize;
    if len > max_len {
        return Err(WireError::DocumentTooLarge(len));
    }
    let bytes = b.get(..len).ok_or(WireError::Truncated("document"))?;
    Ok((decode_document(bytes)?, len))
}

/// Reads a NUL-terminated UTF-8 string at the start of `b`, returning it and its length with
/// the NUL.
fn read_cstring(b: &[u8]) -> Result<(String, usize), WireError> {
    let end = b.iter().position(|&c| c == 0).ok_or(WireError::BadCString("no terminating NUL"))?;
    let s = std::str::from_utf8(&b[..end]).map_err(|_| WireError::BadCString("not UTF-8"))?;
    Ok((s.to_string(), end + 1))
}

/// Parses the message after its header (`body` is `header.length - 16` bytes).
pub fn parse_message(header: &Header, body: &[u8]) -> Result<Request, WireError> {
    if body.len() + HEADER_LEN != header.length {
        return Err(WireError::Truncated("message shorter than its length"));
    }
    match header.op_code {
        OP_MSG => parse_op_msg(header, body),
        OP_QUERY => parse_op_query(header, body),
        other => Err(WireError::UnsupportedOpCode(other)),
    }
}

fn parse_op_msg(header: &Header, body: &[u8]) -> Result<Request, WireError> {
    let flags = u32_at(body, 0).ok_or(WireError::Truncated("flagBits"))?;
    let known = FLAG_CHECKSUM_PRESENT | FLAG_MORE_TO_COME;
    if flags & REQUIRED_BITS & !known != 0 {
        return Err(WireError::UnknownRequiredFlags(flags));
    }
    let mut end = body.len();
    if flags & FLAG_CHECKSUM_PRESENT != 0 {
        end = end.checked_sub(4).filter(|&e| e >= 4).ok_or(WireError::Truncated("checksum"))?;
        let claimed = u32_at(body, end).ok_or(WireError::Truncated("checksum"))?;
        let mut whole = Vec::with_capacity(HEADER_LEN + end);
        whole.extend_from_slice(&(header.length as i32).to_le_bytes());
        whole.extend_from_slice(&header.request_id.to_le_bytes());
        whole.extend_from_slice(&header.response_to.to_le_bytes());
        whole.extend_from_slice(&header.op_code.to_le_bytes());
        whole.extend_from_slice(&body[..end]);
        let computed = crc32c::crc32c(&whole);
        if computed != claimed {
            return Err(WireError::ChecksumMismatch { claimed, computed });
        }
    }
    let max_doc = MAX_BSON_OBJECT_SIZE + COMMAND_ENVELOPE_BYTES;
    let mut at = 4;
    let mut bodies: Vec<Document> = Vec::new();
    let mut sequences: Vec<(String, Vec<Document>)> = Vec::new();
    while at < end {
        let kind = body[at];
        at += 1;
        let rest = &body[at..end];
        match kind {
            0 => {
                let (doc, len) = read_document(rest, max_doc)?;
                bodies.push(doc);
                at += len;
            }
            1 => {
                let size = i32_at(rest, 0).ok_or(WireError::Truncated("document sequence size"))?;
                if size < 5 || size as usize > rest.len() {
                    return Err(WireError::Truncated("document sequence"));
                }
                let seq = &rest[4..size as usize];
                let (id, mut off) = read_cstring(seq)?;
                let mut docs = Vec::new();
                while off < seq.len() {
                    let (doc, len) = read_document(&seq[off..], max_doc)?;
                    docs.push(doc);
                    off += len;
                }
                sequences.push((id, docs));
                at += size as usize;
            }
            k => return Err(WireError::UnknownSectionKind(k)),
        }
    }
    if bodies.len() != 1 {
        return Err(WireError::BodyCount(bodies.len()));
    }
    let mut command = bodies.pop().unwrap_or_default();
    for (id, docs) in sequences {
        if command.contains_key(&id) {
            return Err(WireError::DuplicateSequence(id));
        }
        command.insert(id, docs.into_iter().map(bson::Bson::Document).collect::<Vec<_>>());
    }
    Ok(Request {
        request_id: header.request_id,
        command,
        more_to_come: flags & FLAG_MORE_TO_COME != 0,
        exhaust_allowed: flags & FLAG_EXHAUST_ALLOWED != 0,
        legacy: false,
    })
}

fn parse_op_query(header: &Header, body: &[u8]) -> Result<Request, WireError> {
    let rest = body.get(4..).ok_or(WireError::Truncated("OP_QUERY flags"))?;
    let (collection, len) = read_cstring(rest)?;
    if !collection.ends_with(".$cmd") {
        return Err(WireError::LegacyQuery(collection));
    }
    let rest = rest.get(len + 8..).ok_or(WireError::Truncated("OP_QUERY skip/return"))?;
    let (mut query, _) = read_document(rest, MAX_BSON_OBJECT_SIZE + COMMAND_ENVELOPE_BYTES)?;
    // Old drivers wrap the command as {$query: {...}, $readPreference: ...}.
    if let Ok(inner) = query.get_document("$query") {
        let mut cmd = inner.clone();
        if let Some(rp) = query.get("$readPreference") {
            cmd.insert("$readPreference", rp.clone());
        }
        query = cmd;
    }
    if !query.contains_key("$db") {
        let db = collection.trim_end_matches(".$cmd").to_string();
        query.insert("$db", db);
    }
    Ok(Request {
        request_id: header.request_id,
        command: query,
        more_to_come: false,
        exhaust_allowed: false,
        legacy: true,
    })
}

fn document_bytes(doc: &Document) -> Vec<u8> {
    let mut out = Vec::new();
    // Writing a Document into a Vec cannot fail (no I/O; keys come from our own documents).
    if doc.to_writer(&mut out).is_err() {
        out.clear();
        let _ = bson::doc! { "ok": 0.0, "errmsg": "reply could not be encoded" }.to_writer(&mut out);
    }
    out
}

fn header_bytes(out: &mut Vec<u8>, request_id: i32, response_to: i32, op_code: i32) {
    out.extend_from_slice(&0i32.to_le_bytes()); // length, patched below
    out.extend_from_slice(&request_id.to_le_bytes());
    out.extend_from_slice(&response_to.to_le_bytes());
    out.extend_from_slice(&op_code.to_le_bytes());
}

fn patch_length(out: &mut [u8]) {
    let len = (out.len() as i32).to_le_bytes();
    out[..4].copy_from_slice(&len);
}

/// An OP_MSG reply: flags 0, one body section.
pub fn encode_op_msg(request_id: i32, response_to: i32, doc: &Document) -> Vec<u8> {
    let mut out = Vec::new();
    header_bytes(&mut out, request_id, response_to, OP_MSG);
    out.extend_from_slice(&0u32.to_le_bytes());
    out.push(0);
    out.extend_from_slice(&document_bytes(doc));
    patch_length(&mut out);
    out
}

/// An OP_REPLY (answer to a legacy OP_QUERY handshake): one document.
pub fn encode_op_reply(request_id: i32, response_to: i32, doc: &Document) -> Vec<u8> {
    let mut out = Vec::new();
    header_bytes(&mut out, request_id, response_to, OP_REPLY);
    out.extend_from_slice(&0i32.to_le_bytes()); // responseFlags
    out.extend_from_slice(&0i64.to_le_bytes()); // cursorID
    out.extend_from_slice(&0i32.to_le_bytes()); // startingFrom
    out.extend_from_slice(&1i32.to_le_bytes()); // numberReturned
    out.extend_from_slice(&document_bytes(doc));
    patch_length(&mut out);
    out
}

/// Builds a request the way a driver would (tests and the bad-input tests use it).
pub fn encode_op_msg_request(request_id: i32, flags: u32, body: &Document, seqs: &[(&str, Vec<Document>)]) -> Vec<u8> {
    let mut out = Vec::new();
    header_bytes(&mut out, request_id, 0, OP_MSG);
    out.extend_from_slice(&flags.to_le_bytes());
    out.push(0);
    out.extend_from_slice(&document_bytes(body));
    for (id, docs) in seqs {
        out.push(1);
        let mut seq = Vec::new();
        seq.extend_from_slice(id.as_bytes());
        seq.push(0);
        for d in docs {
            seq.extend_from_slice(&document_bytes(d));
        }
        out.extend_from_slice(&((seq.len() + 4) as i32).to_le_bytes());
        out.extend_from_slice(&seq);
    }
    if flags & FLAG_CHECKSUM_PRESENT != 0 {
        out.extend_from_slice(&0u32.to_le_bytes());
        patch_length(&mut out);
        let n = out.len();
        let crc = crc32c::crc32c(&out[..n - 4]);
        out[n - 4..].copy_from_slice(&crc.to_le_bytes());
    } else {
        patch_length(&mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn parse(bytes: &[u8]) -> Result<Request, WireError> {
        let h: [u8; 16] = bytes[..16].try_into().unwrap();
        let h = parse_header(&h)?;
        parse_message(&h, &bytes[16..])
    }

    #[test]
    fn op_msg_round_trip_with_sequences_and_checksum() {
        let body = doc! { "insert": "c", "$db": "test" };
        let docs = vec![doc! { "_id": 1 }, doc! { "_id": 2 }];
        for flags in [0, FLAG_CHECKSUM_PRESENT, FLAG_CHECKSUM_PRESENT | FLAG_MORE_TO_COME] {
            let bytes = encode_op_msg_request(7, flags, &body, &[("documents", docs.clone())]);
            let r = parse(&bytes).unwrap();
            assert_eq!(r.request_id, 7);
            assert_eq!(r.more_to_come, flags & FLAG_MORE_TO_COME != 0);
            assert_eq!(r.command.get_array("documents").unwrap().len(), 2);
            assert_eq!(r.command.get_str("insert").unwrap(), "c");
        }
    }

    #[test]
    fn bad_checksum_truncation_and_garbage_are_errors() {
        let body = doc! { "ping": 1, "$db": "admin" };
        let mut bytes = encode_op_msg_request(1, FLAG_CHECKSUM_PRESENT, &body, &[]);
        let n = bytes.len();
        bytes[n - 1] ^= 1;
        assert!(matches!(parse(&bytes), Err(WireError::ChecksumMismatch { .. })));
        let bytes = encode_op_msg_request(1, 0, &body, &[]);
        // Every truncation (with the header's length patched to match) is an error, never a panic.
        for cut in 21..bytes.len() {
            let mut b = bytes[..cut].to_vec();
            b[..4].copy_from_slice(&(cut as i32).to_le_bytes());
            assert!(parse(&b).is_err(), "cut at {cut}");
        }
        let mut b = bytes.clone();
        b[..4].copy_from_slice(&i32::MIN.to_le_bytes());
        assert!(matches!(parse(&b), Err(WireError::BadLength(_))));
        let mut b = bytes.clone();
        b[12..16].copy_from_slice(&9999i32.to_le_bytes());
        assert_eq!(parse(&b), Err(WireError::UnsupportedOpCode(9999)));
        let mut b = bytes.clone();
        b[16 + 4 + 1 + 4] = 0x7f; // element type of the first element: invalid
        assert!(matches!(parse(&b), Err(WireError::InvalidBson(_))));
        // Random bytes never panic.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..2_000 {
            let mut b = bytes.clone();
            for _ in 0..3 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let i = 16 + (x as usize % (b.len() - 16));
                b[i] = (x >> 32) as u8;
            }
            let _ = parse(&b);
        }
    }

    #[test]
    fn legacy_query_is_only_for_commands() {
        let mut out = Vec::new();
        header_bytes(&mut out, 3, 0, OP_QUERY);
        out.extend_from_slice(&0i32.to_le_bytes());
        out.extend_from_slice(b"admin.$cmd\0");
        out.extend_from_slice(&0i32.to_le_bytes());
        out.extend_from_slice(&(-1i32).to_le_bytes());
        out.extend_from_slice(&document_bytes(&doc! { "isMaster": 1 }));
        patch_length(&mut out);
        let r = parse(&out).unwrap();
        assert!(r.legacy);
        assert_eq!(r.command.get_str("$db").unwrap(), "admin");
        let reply = encode_op_reply(1, 3, &doc! { "ok": 1.0 });
        assert_eq!(i32::from_le_bytes(reply[..4].try_into().unwrap()) as usize, reply.len());
    }
}
