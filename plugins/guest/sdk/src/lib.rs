//! Write a Concord state-machine plugin as a page of ordinary Rust.
//!
//! A plugin is a function from one command's bytes to its result bytes, or to a
//! [`CommandError`]. It reads and writes the group's data with [`kv`]; those calls act on the
//! apply transaction, and the host keeps a command's writes only if the command succeeds.
//! [`export_plugin!`] generates the exports the host looks for (ABI version 1).
//!
//! ```ignore
//! use concord_plugin_sdk::{CommandError, export_plugin, kv};
//!
//! fn apply(command: &[u8]) -> Result<Vec<u8>, CommandError> {
//!     let old = kv::get(b"last")?.unwrap_or_default();
//!     kv::put(b"last", command)?;
//!     Ok(old)
//! }
//!
//! export_plugin!(apply);
//! ```
//!
//! The SDK installs [`allocator::SizeClassAllocator`] as the plugin's global allocator (the
//! `allocator` feature, on by default; turn default features off to bring your own).
//!
//! Rules the host relies on: keep no state between commands outside the store (an instance may
//! be recreated at any time), and read no clock or randomness (there are none to read:
//! `wasm32-unknown-unknown` has no such imports). Error codes start at 1; codes from
//! [`abi::FAULT_CODE_BASE`] up are the host's.

pub use concord_plugin_abi as abi;

#[cfg(target_arch = "wasm32")]
pub mod allocator;

// One thread per instance on wasm32 is what makes the lock-free allocator sound.
#[cfg(all(feature = "allocator", target_arch = "wasm32"))]
#[global_allocator]
static ALLOCATOR: allocator::SizeClassAllocator = allocator::SizeClassAllocator::new();

/// The failure of one command: recorded as its result; its writes are discarded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommandError {
    /// A stable code, 1 or more.
    pub code: u32,
    /// A human-readable explanation.
    pub message: String,
}

impl CommandError {
    /// A command error with `code` (0 becomes 1) and `message`.
    pub fn new(code: u32, message: impl Into<String>) -> Self {
        CommandError {
            code: code.max(1),
            message: message.into(),
        }
    }
}

/// Code of a [`CommandError`] made from a refused key-value call.
pub const KV_REFUSED: u32 = 900;

impl From<kv::KvError> for CommandError {
    fn from(error: kv::KvError) -> Self {
        CommandError::new(KV_REFUSED, error.to_string())
    }
}

/// The signature of a plugin's command handler.
pub type Handler = fn(&[u8]) -> Result<Vec<u8>, CommandError>;

mod imports {
    #[link(wasm_import_module = "concord")]
    unsafe extern "C" {
        pub fn kv_get(key_ptr: *const u8, key_len: usize, dst_ptr: *mut u8, dst_cap: usize) -> i64;
        pub fn kv_put(
            key_ptr: *const u8,
            key_len: usize,
            value_ptr: *const u8,
            value_len: usize,
        ) -> i32;
        pub fn kv_delete(key_ptr: *const u8, key_len: usize) -> i32;
        pub fn kv_scan(
            start_ptr: *const u8,
            start_len: usize,
            end_ptr: *const u8,
            end_len: i32,
            limit: u32,
            dst_ptr: *mut u8,
            dst_cap: usize,
        ) -> i64;
        pub fn command_result(status: u32, ptr: *const u8, len: usize);
    }
}

/// The group's ordered key-value data, as the current command sees it.
pub mod kv {
    use super::abi;
    use super::imports;

    /// The host refused a call: the key or value is out of bounds.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct KvError(pub abi::KvStatus);

    impl core::fmt::Display for KvError {
        fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
            f.write_str(self.0.describe())
        }
    }

    fn status(code: i64) -> KvError {
        KvError(abi::KvStatus::from_code(code).unwrap_or(abi::KvStatus::OutOfBounds))
    }

    /// Reads into a buffer that grows once if the first guess was short; the answer cannot
    /// change between the two calls (the command itself is the only writer).
    fn read_sized(
        first_guess: usize,
        mut call: impl FnMut(*mut u8, usize) -> i64,
    ) -> Result<Option<Vec<u8>>, KvError> {
        let mut buffer: Vec<u8> = Vec::with_capacity(first_guess);
        for _ in 0..2 {
            let len = call(buffer.as_mut_ptr(), buffer.capacity());
            if len == abi::ABSENT {
                return Ok(None);
            }
            if len < 0 {
                return Err(status(len));
            }
            let len = len as usize;
            if len <= buffer.capacity() {
                // SAFETY: the host wrote exactly `len` bytes into the buffer's capacity.
                unsafe { buffer.set_len(len) };
                return Ok(Some(buffer));
            }
            buffer.reserve_exact(len);
        }
        Err(KvError(abi::KvStatus::OutOfBounds))
    }

    /// The value of `key`.
    pub fn get(key: &[u8]) -> Result<Option<Vec<u8>>, KvError> {
        read_sized(256, |dst, cap| {
            // SAFETY: both buffers are valid for the lengths given.
            unsafe { imports::kv_get(key.as_ptr(), key.len(), dst, cap) }
        })
    }

    /// Sets `key` to `value`.
    pub fn put(key: &[u8], value: &[u8]) -> Result<(), KvError> {
        // SAFETY: both buffers are valid for the lengths given.
        let code = unsafe { imports::kv_put(key.as_ptr(), key.len(), value.as_ptr(), value.len()) };
        if code == 0 {
            Ok(())
        } else {
            Err(status(code.into()))
        }
    }

    /// Removes `key`.
    pub fn delete(key: &[u8]) -> Result<(), KvError> {
        // SAFETY: the buffer is valid for the length given.
        let code = unsafe { imports::kv_delete(key.as_ptr(), key.len()) };
        if code == 0 {
            Ok(())
        } else {
            Err(status(code.into()))
        }
    }

    /// Up to `limit` pairs (at most [`abi::SCAN_LIMIT_MAX`]) of `[start, end)` in key order;
    /// no end bound if `end` is `None`.
    pub fn scan(
        start: &[u8],
        end: Option<&[u8]>,
        limit: u32,
    ) -> Result<Vec<abi::KeyValue>, KvError> {
        let (end_ptr, end_len) = match end {
            Some(end) => (end.as_ptr(), end.len() as i32),
            None => (core::ptr::null(), abi::UNBOUNDED),
        };
        let bytes = read_sized(4096, |dst, cap| {
            // SAFETY: every buffer is valid for the length given.
            unsafe {
                imports::kv_scan(
                    start.as_ptr(),
                    start.len(),
                    end_ptr,
                    end_len,
                    limit,
                    dst,
                    cap,
                )
            }
        })?
        .unwrap_or_default();
        abi::decode_pairs(&bytes).map_err(|_| KvError(abi::KvStatus::OutOfBounds))
    }
}

#[doc(hidden)]
pub mod __private {
    use super::{Handler, abi, imports};

    /// A zeroed buffer of `len` bytes handed to the host, reclaimed by `apply_batch`.
    pub fn alloc(len: u32) -> *mut u8 {
        let buffer = vec![0u8; len as usize].into_boxed_slice();
        Box::into_raw(buffer) as *mut u8
    }

    /// Applies every command of the batch at `ptr`, reporting each result before the next.
    pub fn apply_batch(ptr: *mut u8, len: u32, handler: Handler) -> i32 {
        // SAFETY: the host passes back the buffer `alloc(len)` returned, exactly once.
        let input: Box<[u8]> =
            unsafe { Box::from_raw(core::ptr::slice_from_raw_parts_mut(ptr, len as usize)) };
        let Ok(commands) = abi::decode_batch(&input) else {
            return -1;
        };
        for command in commands {
            match handler(command) {
                // SAFETY: the buffers are valid for the lengths given.
                Ok(result) => unsafe { imports::command_result(0, result.as_ptr(), result.len()) },
                Err(error) => unsafe {
                    imports::command_result(
                        error.code.max(1),
                        error.message.as_ptr(),
                        error.message.len(),
                    )
                },
            }
        }
        0
    }
}

/// Exports `handler` (a [`Handler`]) as the plugin's batch entry point, with the ABI version
/// and the allocator the host needs. `export_plugin!(apply, migrate = migrate)` also exports
/// `migrate` (a [`Handler`] too) as `concord_migrate`: run once when a group switches to this
/// module through an upgrade, its command is the identity of the module the group ran before
/// (`sha256:<hex>` or `bundled:session`); an error refuses the upgrade.
#[macro_export]
macro_rules! export_plugin {
    ($handler:path) => {
        #[unsafe(no_mangle)]
        pub extern "C" fn concord_abi_version() -> u32 {
            $crate::abi::ABI_VERSION
        }

        #[unsafe(no_mangle)]
        pub extern "C" fn concord_alloc(len: u32) -> *mut u8 {
            $crate::__private::alloc(len)
        }

        #[unsafe(no_mangle)]
        pub extern "C" fn concord_apply_batch(ptr: *mut u8, len: u32) -> i32 {
            $crate::__private::apply_batch(ptr, len, $handler)
        }
    };
    ($handler:path, migrate = $migrate:path) => {
        $crate::export_plugin!($handler);

        #[unsafe(no_mangle)]
        pub extern "C" fn concord_migrate(ptr: *mut u8, len: u32) -> i32 {
            $crate::__private::apply_batch(ptr, len, $migrate)
        }
    };
}
