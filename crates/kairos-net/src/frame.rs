//! Length-delimited, versioned, checksummed frames carrying postcard payloads.
//!
//! ```text
//! offset  size  field
//!      0     2  magic  b"KR" (0x4B 0x52)
//!      2     1  version (FRAME_VERSION = 1)
//!      3     1  kind: 1 = Hello, 2 = Msg
//!      4     4  payload length, u32 little-endian (checked against the limit before allocating)
//!      8     8  xxh3-64 of the payload, u64 little-endian
//!     16     n  payload (postcard)
//! ```
//!
//! Decoding never panics and never allocates more than the configured maximum payload size:
//! every problem is a [`FrameError`].

use kairos_core::NodeId;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncReadExt};
use xxhash_rust::xxh3::xxh3_64;

/// The two magic bytes that open every frame (`b"KR"`).
pub const MAGIC: [u8; 2] = *b"KR";
/// The only frame version this build speaks.
pub const FRAME_VERSION: u8 = 1;
/// Size of the fixed header in bytes.
pub const HEADER_LEN: usize = 16;
/// Default limit on a frame's payload (4 MiB).
pub const DEFAULT_MAX_FRAME_BYTES: u32 = 4 * 1024 * 1024;

/// What a frame carries.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum FrameKind {
    /// The first frame of every connection: the dialer's [`Hello`].
    Hello = 1,
    /// One protocol message (`P::Msg`, postcard-encoded).
    Msg = 2,
}

impl FrameKind {
    fn from_byte(b: u8) -> Option<Self> {
        match b {
            1 => Some(FrameKind::Hello),
            2 => Some(FrameKind::Msg),
            _ => None,
        }
    }
}

/// The dialer's introduction: who it is and which cluster it believes it belongs to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub node: NodeId,
    pub cluster: String,
}

/// Why a frame could not be encoded or decoded.
#[derive(Debug, Error)]
pub enum FrameError {
    #[error("bad magic bytes {0:02x?}: the peer does not speak the Kairos frame protocol (expected {MAGIC:02x?})")]
    BadMagic([u8; 2]),
    #[error("unsupported frame version {0}; this build speaks version {FRAME_VERSION}: run the same Kairos version on every node")]
    UnsupportedVersion(u8),
    #[error("unknown frame kind {0} (expected 1 = Hello or 2 = Msg)")]
    UnknownKind(u8),
    #[error("frame payload of {len} bytes exceeds the limit of {max} bytes (raise `max_frame_bytes` in the cluster config if this is legitimate)")]
    Oversized { len: u64, max: u32 },
    #[error(
        "checksum mismatch: header says {expected:#018x}, payload hashes to {actual:#018x} (corrupted or forged frame)"
    )]
    ChecksumMismatch { expected: u64, actual: u64 },
    #[error("payload does not decode: {0}")]
    Decode(#[source] postcard::Error),
    #[error("payload decodes but leaves {0} trailing bytes")]
    TrailingBytes(usize),
    #[error("payload does not encode: {0}")]
    Encode(#[source] postcard::Error),
    #[error("truncated frame: the connection ended {0}")]
    Truncated(&'static str),
    #[error("i/o error while reading a frame: {0}")]
    Io(#[from] std::io::Error),
}

/// A parsed, validated frame header.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub kind: FrameKind,
    pub len: u32,
    pub checksum: u64,
}

/// Builds a frame around an already-encoded payload. Fails if the payload exceeds `max`.
pub fn encode_raw(kind: FrameKind, payload: &[u8], max: u32) -> Result<Vec<u8>, FrameError> {
    let len = u32::try_from(payload.len())
        .ok()
        .filter(|&l| l <= max)
        .ok_or(FrameError::Oversized { len: payload.len() as u64, max })?;
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(&MAGIC);
    out.push(FRAME_VERSION);
    out.push(kind as u8);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&xxh3_64(payload).to_le_bytes());
    out.extend_from_slice(payload);
    Ok(out)
}

/// Encodes `value` with postcard and frames it: one buffer, the payload written in place after
/// a header that is filled in once its length and checksum are known (no second buffer and
/// copy, as framing an encoded payload with [`encode_raw`] takes).
pub fn encode<T: Serialize>(kind: FrameKind, value: &T, max: u32) -> Result<Vec<u8>, FrameError> {
    let mut out = Vec::with_capacity(HEADER_LEN + 64);
    out.extend_from_slice(&MAGIC);
    out.push(FRAME_VERSION);
    out.push(kind as u8);
    out.extend_from_slice(&[0; HEADER_LEN - 4]);
    let mut out = postcard::to_extend(value, out).map_err(FrameError::Encode)?;
    let payload_len = out.len() - HEADER_LEN;
    let len = u32::try_from(payload_len)
        .ok()
        .filter(|&l| l <= max)
        .ok_or(FrameError::Oversized { len: payload_len as u64, max })?;
    let checksum = xxh3_64(&out[HEADER_LEN..]);
    out[4..8].copy_from_slice(&len.to_le_bytes());
    out[8..16].copy_from_slice(&checksum.to_le_bytes());
    Ok(out)
}

/// Validates the fixed header (magic, version, kind, length limit).
pub fn decode_header(bytes: &[u8; HEADER_LEN], max: u32) -> Result<Header, FrameError> {
    let magic = [bytes[0], bytes[1]];
    if magic != MAGIC {
        return Err(FrameError::BadMagic(magic));
    }
    if bytes[2] != FRAME_VERSION {
        return Err(FrameError::UnsupportedVersion(bytes[2]));
    }
    let kind = FrameKind::from_byte(bytes[3]).ok_or(FrameError::UnknownKind(bytes[3]))?;
    let len = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
    if len > max {
        return Err(FrameError::Oversized { len: u64::from(len), max });
    }
    let mut sum = [0u8; 8];
    sum.copy_from_slice(&bytes[8..16]);
    Ok(Header { kind, len, checksum: u64::from_le_bytes(sum) })
}

fn verify(header: &Header, payload: &[u8]) -> Result<(), FrameError> {
    let actual = xxh3_64(payload);
    if actual != header.checksum {
        return Err(FrameError::ChecksumMismatch { expected: header.checksum, actual });
    }
    Ok(())
}

/// Decodes one frame from the front of `buf`: its kind, its payload, and how many bytes of
/// `buf` it used. A `buf` that ends before the frame does is [`FrameError::Truncated`].
pub fn decode_frame(buf: &[u8], max: u32) -> Result<(FrameKind, &[u8], usize), FrameError> {
    let head: &[u8; HEADER_LEN] =
        buf.get(..HEADER_LEN).and_then(|h| h.try_into().ok()).ok_or(FrameError::Truncated("inside a frame header"))?;
    let header = decode_header(head, max)?;
    let end = HEADER_LEN + header.len as usize;
    let payload = buf.get(HEADER_LEN..end).ok_or(FrameError::Truncated("inside a frame payload"))?;
    verify(&header, payload)?;
    Ok((header.kind, payload, end))
}

/// Decodes a postcard payload, rejecting trailing bytes.
pub fn decode_payload<T: DeserializeOwned>(payload: &[u8]) -> Result<T, FrameError> {
    let (value, rest) = postcard::take_from_bytes::<T>(payload).map_err(FrameError::Decode)?;
    if !rest.is_empty() {
        return Err(FrameError::TrailingBytes(rest.len()));
    }
    Ok(value)
}

/// Reads one frame from a stream. `Ok(None)` is a clean end of stream between frames; an end
/// inside a frame is [`FrameError::Truncated`]. The payload buffer is allocated only after the
/// header passed its checks, so a hostile length costs nothing.
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R, max: u32) -> Result<Option<(FrameKind, Vec<u8>)>, FrameError> {
    let mut head = [0u8; HEADER_LEN];
    let mut filled = 0;
    while filled < HEADER_LEN {
        let n = r.read(&mut head[filled..]).await?;
        if n == 0 {
            return if filled == 0 { Ok(None) } else { Err(FrameError::Truncated("inside a frame header")) };
        }
        filled += n;
    }
    let header = decode_header(&head, max)?;
    let mut payload = vec![0u8; header.len as usize];
    r.read_exact(&mut payload).await.map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => FrameError::Truncated("inside a frame payload"),
        _ => FrameError::Io(e),
    })?;
    verify(&header, &payload)?;
    Ok(Some((header.kind, payload)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MAX: u32 = 1024;

    fn hello() -> Hello {
        Hello { node: NodeId(3), cluster: "demo".into() }
    }

    #[test]
    fn round_trip() {
        let f = encode(FrameKind::Hello, &hello(), MAX).unwrap();
        assert_eq!(&f[..2], b"KR");
        let (kind, payload, used) = decode_frame(&f, MAX).unwrap();
        assert_eq!((kind, used), (FrameKind::Hello, f.len()));
        assert_eq!(decode_payload::<Hello>(payload).unwrap(), hello());
    }

    #[tokio::test]
    async fn stream_round_trip_and_clean_eof() {
        let mut bytes = encode(FrameKind::Msg, &(7u64, "x".to_string()), MAX).unwrap();
        bytes.extend(encode(FrameKind::Hello, &hello(), MAX).unwrap());
        let mut r = &bytes[..];
        let (k, p) = read_frame(&mut r, MAX).await.unwrap().unwrap();
        assert_eq!(k, FrameKind::Msg);
        assert_eq!(decode_payload::<(u64, String)>(&p).unwrap(), (7, "x".to_string()));
        let (k, _) = read_frame(&mut r, MAX).await.unwrap().unwrap();
        assert_eq!(k, FrameKind::Hello);
        assert!(read_frame(&mut r, MAX).await.unwrap().is_none());
    }

    #[test]
    fn every_bad_frame_is_a_typed_error() {
        let good = encode(FrameKind::Hello, &hello(), MAX).unwrap();
        let mut bad_magic = good.clone();
        bad_magic[0] = b'X';
        assert!(matches!(decode_frame(&bad_magic, MAX), Err(FrameError::BadMagic(_))));
        let mut bad_version = good.clone();
        bad_version[2] = 9;
        assert!(matches!(decode_frame(&bad_version, MAX), Err(FrameError::UnsupportedVersion(9))));
        let mut bad_kind = good.clone();
        bad_kind[3] = 0;
        assert!(matches!(decode_frame(&bad_kind, MAX), Err(FrameError::UnknownKind(0))));
        let mut oversized = good.clone();
        oversized[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(decode_frame(&oversized, MAX), Err(FrameError::Oversized { .. })));
        let mut bad_sum = good.clone();
        let last = bad_sum.len() - 1;
        bad_sum[last] ^= 1;
        assert!(matches!(decode_frame(&bad_sum, MAX), Err(FrameError::ChecksumMismatch { .. })));
        for cut in [0, 5, HEADER_LEN, good.len() - 1] {
            assert!(matches!(decode_frame(&good[..cut], MAX), Err(FrameError::Truncated(_))), "cut {cut}");
        }
        let junk = encode_raw(FrameKind::Msg, &[0xff, 0xff, 0xff], MAX).unwrap();
        let (_, p, _) = decode_frame(&junk, MAX).unwrap();
        assert!(matches!(decode_payload::<Hello>(p), Err(FrameError::Decode(_))));
        let extra = encode_raw(FrameKind::Msg, &[1, 2], MAX).unwrap();
        let (_, p, _) = decode_frame(&extra, MAX).unwrap();
        assert!(matches!(decode_payload::<u8>(p), Err(FrameError::TrailingBytes(1))));
        assert!(matches!(encode_raw(FrameKind::Msg, &[0; 2000], MAX), Err(FrameError::Oversized { .. })));
    }

    #[tokio::test]
    async fn stream_truncation_and_oversize_do_not_allocate() {
        let good = encode(FrameKind::Hello, &hello(), MAX).unwrap();
        let mut r = &good[..good.len() - 2];
        assert!(matches!(read_frame(&mut r, MAX).await, Err(FrameError::Truncated(_))));
        let mut r = &good[..3];
        assert!(matches!(read_frame(&mut r, MAX).await, Err(FrameError::Truncated(_))));
        let mut huge = good[..HEADER_LEN].to_vec();
        huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        let mut r = &huge[..];
        assert!(matches!(read_frame(&mut r, u32::MAX - 1).await, Err(FrameError::Oversized { .. })));
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            if let Ok((_, p, used)) = decode_frame(&bytes, MAX) {
                prop_assert!(used <= bytes.len());
                let _ = decode_payload::<Hello>(p);
                let _ = decode_payload::<Vec<(u64, String)>>(p);
            }
            let _ = decode_payload::<Vec<(u64, String)>>(&bytes);
        }

        #[test]
        fn random_payload_behind_a_valid_header_never_panics(
            hello_kind in any::<bool>(), payload in proptest::collection::vec(any::<u8>(), 0..256)
        ) {
            let kind = if hello_kind { FrameKind::Hello } else { FrameKind::Msg };
            let f = encode_raw(kind, &payload, MAX).unwrap();
            let (k, p, used) = decode_frame(&f, MAX).unwrap();
            prop_assert_eq!((k, p, used), (kind, &payload[..], f.len()));
            let _ = decode_payload::<Hello>(p);
        }

        #[test]
        fn corrupting_one_byte_is_always_detected(idx in 0usize..64, flip in 1u8..=255) {
            let mut g = encode(FrameKind::Hello, &hello(), MAX).unwrap();
            let i = idx % g.len();
            // The kind byte is not covered by the checksum (flipping Hello to Msg is undetectable).
            prop_assume!(i != 3);
            g[i] ^= flip;
            prop_assert!(decode_frame(&g, MAX).is_err(), "corrupting byte {} went unnoticed", i);
        }
    }
}
