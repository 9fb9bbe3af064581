//! A size-class allocator for plugins: the allocation pattern of a command handler is many small,
//! short-lived buffers (decoded fields, encoded values), which a free list per power-of-two size
//! serves in a few instructions, where the general-purpose allocator walks its bins.
//!
//! Small requests (up to [`LARGEST_CLASS_BYTES`], alignment up to [`CLASS_ALIGN`]) are rounded
//! up to a power of two and served from that size's free list, refilled from 64 KiB regions.
//! The first region is the free end of the module's initial memory (from `__heap_base` to the
//! initial size, which the system allocator never uses: it grows memory for what it needs):
//! the host starts every batch in a fresh instance, and a batch that fits there never grows
//! memory, which is what keeps a fresh instance cheap.
//! Everything else goes to the system allocator. Freed small blocks go back to their own list
//! and are never merged: a plugin's memory is capped by the host, and hitting the cap is a
//! deterministic fault of the command, like any other allocation failure.
//!
//! wasm32-unknown-unknown runs one thread per instance, so the state needs no lock.

use core::alloc::{GlobalAlloc, Layout};
use core::cell::UnsafeCell;
use core::ptr;

use std::alloc::System;

/// The smallest class; also the alignment every block gets.
const CLASS_ALIGN: usize = 16;
/// The largest request served from a free list.
const LARGEST_CLASS_BYTES: usize = 16 * 1024;
/// Classes 16, 32, ..., 16 KiB.
const CLASS_COUNT: usize = 11;
/// Bytes taken from the system allocator at a time to carve blocks from.
const REGION_BYTES: usize = 64 * 1024;

/// The allocator `export_plugin!` plugins run with (installed by the SDK's `allocator`
/// feature, on by default).
pub struct SizeClassAllocator {
    state: UnsafeCell<State>,
}

struct State {
    /// Head of each class's list of free blocks; a free block's first word links to the next.
    free_lists: [*mut u8; CLASS_COUNT],
    /// The unused rest of the current region.
    region_next: *mut u8,
    region_end: *mut u8,
    /// Whether the initial memory's free end has been taken as a region.
    initial_tail_taken: bool,
}

unsafe extern "C" {
    /// Where the linker put the end of the stack and static data: the heap starts here.
    static __heap_base: u8;
    /// The end of the module's initial memory.
    static __heap_end: u8;
}

/// The part of the module's initial memory past `__heap_base`, aligned for the classes (empty
/// if there is none).
fn initial_memory_tail() -> (*mut u8, *mut u8) {
    let heap_base = ptr::addr_of!(__heap_base) as usize;
    let start = heap_base.next_multiple_of(CLASS_ALIGN);
    let end = ptr::addr_of!(__heap_end) as usize;
    if end <= start {
        return (ptr::null_mut(), ptr::null_mut());
    }
    (start as *mut u8, end as *mut u8)
}

// SAFETY: wasm32-unknown-unknown has no threads; the state is only ever touched by one.
unsafe impl Sync for SizeClassAllocator {}

impl SizeClassAllocator {
    /// An allocator with empty lists.
    pub const fn new() -> Self {
        SizeClassAllocator {
            state: UnsafeCell::new(State {
                free_lists: [ptr::null_mut(); CLASS_COUNT],
                region_next: ptr::null_mut(),
                region_end: ptr::null_mut(),
                initial_tail_taken: false,
            }),
        }
    }
}

impl Default for SizeClassAllocator {
    fn default() -> Self {
        Self::new()
    }
}

/// The class serving `layout`, if a class does.
fn class_of(layout: Layout) -> Option<usize> {
    if layout.size() > LARGEST_CLASS_BYTES || layout.align() > CLASS_ALIGN {
        return None;
    }
    let rounded = layout.size().max(CLASS_ALIGN).next_power_of_two();
    Some((rounded.trailing_zeros() - CLASS_ALIGN.trailing_zeros()) as usize)
}

fn class_bytes(class: usize) -> usize {
    CLASS_ALIGN << class
}

impl State {
    /// # Safety
    /// Single-threaded use only.
    unsafe fn alloc_class(&mut self, class: usize) -> *mut u8 {
        let head = self.free_lists[class];
        if !head.is_null() {
            // SAFETY: a free block's first word holds the next free block (or null).
            self.free_lists[class] = unsafe { head.cast::<*mut u8>().read() };
            return head;
        }
        let bytes = class_bytes(class);
        if !self.initial_tail_taken {
            self.initial_tail_taken = true;
            (self.region_next, self.region_end) = initial_memory_tail();
        }
        if (self.region_end as usize) - (self.region_next as usize) < bytes {
            // The tail of the old region (less than one block of this class) is left unused.
            // SAFETY: a valid, non-zero layout.
            let region = unsafe {
                System.alloc(Layout::from_size_align_unchecked(REGION_BYTES, CLASS_ALIGN))
            };
            if region.is_null() {
                return ptr::null_mut();
            }
            self.region_next = region;
            // SAFETY: within (one past) the region just allocated.
            self.region_end = unsafe { region.add(REGION_BYTES) };
        }
        let block = self.region_next;
        // SAFETY: `bytes` fit in what is left of the region.
        self.region_next = unsafe { block.add(bytes) };
        block
    }

    /// # Safety
    /// `block` came from `alloc_class(class)` and is not used again.
    unsafe fn free_class(&mut self, block: *mut u8, class: usize) {
        // SAFETY: the block is at least 16 bytes and 16-aligned: room for the link.
        unsafe { block.cast::<*mut u8>().write(self.free_lists[class]) };
        self.free_lists[class] = block;
    }
}

// SAFETY: every block handed out is `class_bytes(class)` long, aligned to 16, and owned by the
// caller until freed; other layouts are the system allocator's.
unsafe impl GlobalAlloc for SizeClassAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match class_of(layout) {
            // SAFETY: single-threaded (see the `Sync` impl).
            Some(class) => unsafe { (*self.state.get()).alloc_class(class) },
            // SAFETY: forwarded with the caller's guarantees.
            None => unsafe { System.alloc(layout) },
        }
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        match class_of(layout) {
            // SAFETY: the same layout allocated it from this class.
            Some(class) => unsafe { (*self.state.get()).free_class(block, class) },
            // SAFETY: forwarded with the caller's guarantees.
            None => unsafe { System.dealloc(block, layout) },
        }
    }

    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `new_size` is valid for this alignment (the caller's guarantee).
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        match (class_of(layout), class_of(new_layout)) {
            // Still fits its block: nothing moves.
            (Some(old), Some(new)) if old == new => block,
            // SAFETY: both layouts are the system allocator's.
            (None, None) => unsafe { System.realloc(block, layout, new_size) },
            _ => {
                // SAFETY: allocate, copy the bytes both blocks hold, free the old one.
                unsafe {
                    let moved = self.alloc(new_layout);
                    if !moved.is_null() {
                        ptr::copy_nonoverlapping(block, moved, layout.size().min(new_size));
                        self.dealloc(block, layout);
                    }
                    moved
                }
            }
        }
    }
}
