//! A small, deterministic binary codec: little-endian integers, length-prefixed bytes.

use crate::SessionError;

/// Appends values to a byte buffer.
#[derive(Default)]
pub struct Writer {
    bytes: Vec<u8>,
}

impl Writer {
    /// An empty writer.
    pub fn new() -> Self {
        Self::default()
    }

    /// A writer with room for `bytes` bytes, so that encoding a record of about that size
    /// does not grow its buffer step by step.
    pub fn with_capacity(bytes: usize) -> Self {
        Writer {
            bytes: Vec::with_capacity(bytes),
        }
    }

    /// The bytes written.
    pub fn finish(self) -> Vec<u8> {
        self.bytes
    }

    /// Writes one byte.
    pub fn u8(&mut self, value: u8) {
        self.bytes.push(value);
    }

    /// Writes a bool as one byte.
    pub fn bool(&mut self, value: bool) {
        self.u8(value as u8);
    }

    /// Writes a u32.
    pub fn u32(&mut self, value: u32) {
        self.bytes.extend_from_slice(&value.to_le_bytes());
    }

    /// Writes a u64.
    pub fn u64(&mut self, value: u64) {
        self.bytes.extend_from_slice(&value.to_le_bytes());
    }

    /// Writes `len u32 | bytes`.
    pub fn bytes(&mut self, value: &[u8]) {
        self.u32(value.len() as u32);
        self.bytes.extend_from_slice(value);
    }

    /// Writes a string as bytes.
    pub fn str(&mut self, value: &str) {
        self.bytes(value.as_bytes());
    }

    /// Writes a presence byte, then the value if present.
    pub fn option<T>(&mut self, value: Option<&T>, write: impl FnOnce(&mut Self, &T)) {
        match value {
            None => self.u8(0),
            Some(value) => {
                self.u8(1);
                write(self, value);
            }
        }
    }
}

/// Reads values written by [`Writer`]; every read is bounds-checked.
pub struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    /// A reader over `bytes`.
    pub fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes }
    }

    #[inline]
    fn take(&mut self, len: usize, what: &str) -> Result<&'a [u8], SessionError> {
        if len > self.bytes.len() {
            return Err(past_the_end(what));
        }
        let (head, rest) = self.bytes.split_at(len);
        self.bytes = rest;
        Ok(head)
    }

    /// Reads one byte.
    #[inline]
    pub fn u8(&mut self, what: &str) -> Result<u8, SessionError> {
        Ok(self.take(1, what)?[0])
    }

    /// Reads a bool; only 0 and 1 are valid.
    #[inline]
    pub fn bool(&mut self, what: &str) -> Result<bool, SessionError> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(not_a_bool(what)),
        }
    }

    /// Reads a u32.
    #[inline]
    pub fn u32(&mut self, what: &str) -> Result<u32, SessionError> {
        let bytes = self.take(4, what)?;
        Ok(u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    /// Reads a u64.
    #[inline]
    pub fn u64(&mut self, what: &str) -> Result<u64, SessionError> {
        let mut array = [0u8; 8];
        array.copy_from_slice(self.take(8, what)?);
        Ok(u64::from_le_bytes(array))
    }

    /// Reads length-prefixed bytes.
    #[inline]
    pub fn bytes(&mut self, what: &str) -> Result<&'a [u8], SessionError> {
        let len = self.u32(what)? as usize;
        self.take(len, what)
    }

    /// Reads a length-prefixed UTF-8 string.
    #[inline]
    pub fn string(&mut self, what: &str) -> Result<String, SessionError> {
        let bytes = self.bytes(what)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| SessionError::malformed(format!("{what} is not UTF-8")))
    }

    /// Reads a presence byte, then the value if present.
    pub fn option<T>(
        &mut self,
        what: &str,
        read: impl FnOnce(&mut Self) -> Result<T, SessionError>,
    ) -> Result<Option<T>, SessionError> {
        if self.bool(what)? {
            Ok(Some(read(self)?))
        } else {
            Ok(None)
        }
    }

    /// Fails unless every byte was read.
    pub fn finish(self, what: &str) -> Result<(), SessionError> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(SessionError::malformed(format!("bytes after the {what}")))
        }
    }
}

// The error paths stay out of line, so the readers inline into the decoders: decoding is most of
// a command's cost.
#[cold]
#[inline(never)]
fn past_the_end(what: &str) -> SessionError {
    SessionError::malformed(format!("{what} runs past the end"))
}

#[cold]
#[inline(never)]
fn not_a_bool(what: &str) -> SessionError {
    SessionError::malformed(format!("{what} is not a bool"))
}
