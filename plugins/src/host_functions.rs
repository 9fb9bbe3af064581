//! The functions a plugin imports (module `concord`), bound to the apply transaction.

use std::ops::Range;

use bytes::Bytes;
use concord_consensus::{ApplyError, CommandError};
use concord_plugin_abi::{self as abi, KvStatus};
use concord_storage::{KeyRange, KeyValue, StateTransaction, StorageError};
use wasmtime::{Caller, Linker, Trap};

use crate::command_scope::CommandScope;
use crate::host_state::{Fault, HostState};

/// Fuel every host call costs on top of the call itself, and the bytes it moves per extra unit:
/// host work is paid for like guest work, so a plugin cannot hide a runaway loop in host calls.
const HOST_CALL_FUEL: u64 = 100;
const BYTES_PER_FUEL: u64 = 8;
/// Pairs read from the store at a time while scanning, so a scan of huge values stops at the
/// plugin's memory cap instead of materializing all of them.
const SCAN_CHUNK_PAIRS: usize = 8;
/// Longest error message kept from a plugin, in bytes.
const ERROR_MESSAGE_BYTES_MAX: usize = 4096;

/// Adds the host functions to `linker`.
pub(crate) fn define(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap(abi::IMPORT_MODULE, abi::IMPORT_KV_GET, kv_get)?;
    linker.func_wrap(abi::IMPORT_MODULE, abi::IMPORT_KV_PUT, kv_put)?;
    linker.func_wrap(abi::IMPORT_MODULE, abi::IMPORT_KV_DELETE, kv_delete)?;
    linker.func_wrap(abi::IMPORT_MODULE, abi::IMPORT_KV_SCAN, kv_scan)?;
    linker.func_wrap(
        abi::IMPORT_MODULE,
        abi::IMPORT_COMMAND_RESULT,
        command_result,
    )?;
    Ok(())
}

/// The guest memory range `[ptr, ptr + len)`, if it lies inside `memory`.
fn guest_range(memory: &[u8], ptr: i32, len: usize) -> Option<Range<usize>> {
    let start = ptr as u32 as usize;
    let end = start.checked_add(len)?;
    (end <= memory.len()).then_some(start..end)
}

/// Burns `bytes`' worth of fuel for a host call; out of fuel is the usual deterministic trap.
fn charge(caller: &mut Caller<'_, HostState>, bytes: usize) -> wasmtime::Result<()> {
    let cost = HOST_CALL_FUEL + bytes as u64 / BYTES_PER_FUEL;
    let fuel = caller.get_fuel()?;
    if fuel < cost {
        caller.set_fuel(0)?;
        return Err(Trap::OutOfFuel.into());
    }
    caller.set_fuel(fuel - cost)?;
    Ok(())
}

/// Ends the call: the host failed, and that must not become anyone's result.
fn host_failure(state: &mut HostState, error: StorageError) -> wasmtime::Error {
    state.fault = Some(Fault::Host(ApplyError::Storage(error)));
    wasmtime::Error::msg("state store failed")
}

/// Ends the call: the plugin broke the ABI.
fn abi_violation(state: &mut HostState, problem: String) -> wasmtime::Error {
    let error = wasmtime::Error::msg(problem.clone());
    state.fault = Some(Fault::Abi(problem));
    error
}

fn no_call_in_progress(state: &mut HostState) -> wasmtime::Error {
    abi_violation(state, "a host function was called outside a batch".into())
}

fn kv_get(
    mut caller: Caller<'_, HostState>,
    key_ptr: i32,
    key_len: i32,
    dst_ptr: i32,
    dst_cap: i32,
) -> wasmtime::Result<i64> {
    let Some(memory) = caller.data().memory else {
        return Err(no_call_in_progress(caller.data_mut()));
    };
    let (data, state) = memory.data_and_store_mut(&mut caller);
    let Some(key) = guest_range(data, key_ptr, key_len as u32 as usize) else {
        return Ok(KvStatus::OutOfBounds as i64);
    };
    let Some((scope, txn)) = state.scope_and_txn() else {
        return Err(no_call_in_progress(state));
    };
    let value = match scope.get(txn, &data[key.clone()]) {
        Ok(value) => value,
        Err(error) => return Err(host_failure(state, error)),
    };
    let Some(value) = value else {
        charge(&mut caller, key.len())?;
        return Ok(abi::ABSENT);
    };
    if value.len() <= dst_cap as u32 as usize {
        match guest_range(data, dst_ptr, value.len()) {
            Some(dst) => data[dst].copy_from_slice(&value),
            None => return Ok(KvStatus::OutOfBounds as i64),
        }
    }
    charge(&mut caller, key.len() + value.len())?;
    Ok(value.len() as i64)
}

fn kv_put(
    mut caller: Caller<'_, HostState>,
    key_ptr: i32,
    key_len: i32,
    value_ptr: i32,
    value_len: i32,
) -> wasmtime::Result<i32> {
    let Some(memory) = caller.data().memory else {
        return Err(no_call_in_progress(caller.data_mut()));
    };
    let (data, state) = memory.data_and_store_mut(&mut caller);
    let (Some(key), Some(value)) = (
        guest_range(data, key_ptr, key_len as u32 as usize),
        guest_range(data, value_ptr, value_len as u32 as usize),
    ) else {
        return Ok(KvStatus::OutOfBounds as i32);
    };
    let moved = key.len() + value.len();
    let Some((scope, _)) = state.scope_and_txn() else {
        return Err(no_call_in_progress(state));
    };
    let status = match scope.put(&data[key], &data[value]) {
        Ok(()) => 0,
        Err(status) => status as i32,
    };
    charge(&mut caller, moved)?;
    Ok(status)
}

fn kv_delete(
    mut caller: Caller<'_, HostState>,
    key_ptr: i32,
    key_len: i32,
) -> wasmtime::Result<i32> {
    let Some(memory) = caller.data().memory else {
        return Err(no_call_in_progress(caller.data_mut()));
    };
    let (data, state) = memory.data_and_store_mut(&mut caller);
    let Some(key) = guest_range(data, key_ptr, key_len as u32 as usize) else {
        return Ok(KvStatus::OutOfBounds as i32);
    };
    let moved = key.len();
    let Some((scope, _)) = state.scope_and_txn() else {
        return Err(no_call_in_progress(state));
    };
    let status = match scope.delete(&data[key]) {
        Ok(()) => 0,
        Err(status) => status as i32,
    };
    charge(&mut caller, moved)?;
    Ok(status)
}

#[allow(clippy::too_many_arguments)]
fn kv_scan(
    mut caller: Caller<'_, HostState>,
    start_ptr: i32,
    start_len: i32,
    end_ptr: i32,
    end_len: i32,
    limit: i32,
    dst_ptr: i32,
    dst_cap: i32,
) -> wasmtime::Result<i64> {
    let Some(memory) = caller.data().memory else {
        return Err(no_call_in_progress(caller.data_mut()));
    };
    let (data, state) = memory.data_and_store_mut(&mut caller);
    let Some(start) = guest_range(data, start_ptr, start_len as u32 as usize) else {
        return Ok(KvStatus::OutOfBounds as i64);
    };
    let range = if end_len == abi::UNBOUNDED {
        KeyRange::from(&data[start])
    } else {
        match guest_range(data, end_ptr, end_len as u32 as usize) {
            Some(end) => KeyRange::between(&data[start], &data[end]),
            None => return Ok(KvStatus::OutOfBounds as i64),
        }
    };
    let limit = (limit as u32).min(abi::SCAN_LIMIT_MAX) as usize;
    // The encoded answer must fit the plugin's memory; stop reading as soon as it cannot.
    let bytes_max = state.memory_bytes_max;
    let Some((scope, txn)) = state.scope_and_txn() else {
        return Err(no_call_in_progress(state));
    };
    let pairs = match scan_bounded(scope, txn, range, limit, bytes_max) {
        Ok(Some(pairs)) => pairs,
        Ok(None) => return Ok(KvStatus::OutOfBounds as i64),
        Err(error) => return Err(host_failure(state, error)),
    };
    let mut encoded = Vec::new();
    abi::encode_pairs(&pairs, &mut encoded);
    if encoded.len() <= dst_cap as u32 as usize {
        match guest_range(data, dst_ptr, encoded.len()) {
            Some(dst) => data[dst].copy_from_slice(&encoded),
            None => return Ok(KvStatus::OutOfBounds as i64),
        }
    }
    charge(&mut caller, encoded.len())?;
    Ok(encoded.len() as i64)
}

/// Up to `limit` pairs of `range`, read a chunk at a time; `None` if their encoding would not
/// fit in `bytes_max`.
fn scan_bounded(
    scope: &CommandScope,
    txn: &StateTransaction<'_>,
    mut range: KeyRange,
    limit: usize,
    bytes_max: usize,
) -> Result<Option<Vec<KeyValue>>, StorageError> {
    let mut pairs = Vec::new();
    let mut encoded_len = 4usize;
    while pairs.len() < limit && !range.is_empty() {
        let asked = SCAN_CHUNK_PAIRS.min(limit - pairs.len());
        let chunk = scope.scan(txn, &range, asked)?;
        let exhausted = chunk.len() < asked;
        for (key, value) in chunk {
            encoded_len += 8 + key.len() + value.len();
            if encoded_len > bytes_max {
                return Ok(None);
            }
            range = range.after(&key);
            pairs.push((key, value));
        }
        if exhausted {
            break;
        }
    }
    Ok(Some(pairs))
}

/// The command boundary: keeps or drops the command's writes, records its result and gives
/// the next command a fresh fuel budget.
fn command_result(
    mut caller: Caller<'_, HostState>,
    status: i32,
    ptr: i32,
    len: i32,
) -> wasmtime::Result<()> {
    let Some(memory) = caller.data().memory else {
        return Err(no_call_in_progress(caller.data_mut()));
    };
    let (data, state) = memory.data_and_store_mut(&mut caller);
    let Some(bytes) = guest_range(data, ptr, len as u32 as usize) else {
        return Err(abi_violation(
            state,
            "command_result: the result lies outside the plugin's memory".into(),
        ));
    };
    if state.results.len() >= state.commands_in_call {
        return Err(abi_violation(
            state,
            "command_result: more results than commands".into(),
        ));
    }
    let Some((scope, txn)) = state.scope_and_txn() else {
        return Err(no_call_in_progress(state));
    };
    let result = if status == 0 {
        scope.commit_into(txn);
        Ok(Bytes::copy_from_slice(&data[bytes]))
    } else {
        scope.discard();
        let message = &data[bytes];
        let message = &message[..message.len().min(ERROR_MESSAGE_BYTES_MAX)];
        Err(CommandError::new(
            status as u32,
            String::from_utf8_lossy(message).into_owned(),
        ))
    };
    state.results.push(result);
    let fuel = state.fuel_per_command;
    let left = caller.get_fuel()?;
    caller.data_mut().fuel_used += fuel.saturating_sub(left);
    caller.set_fuel(fuel)?;
    Ok(())
}
