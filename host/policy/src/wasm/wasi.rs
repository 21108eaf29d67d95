//! The WASI a policy gets: what the Rust standard library imports, and nothing that can block.
//!
//! - clocks, random, environment (empty), exit, stdin (empty), stdout/stderr and the
//!   filesystem without a single preopened directory: from wasmtime-wasi, all non-blocking;
//! - `wasi:io/streams`: pinset's own, synchronous. A write takes what the stream's buffer has
//!   room for and drops the rest (stderr is kept, bounded, to quote a panic; stdout is dropped),
//!   so a policy that prints never waits and never fails for printing. wasmtime-wasi's own
//!   version enters a tokio runtime for every blocking write and every drop, which panics when
//!   the call comes from async code — the agent's, `pinset node`'s;
//! - `wasi:io/poll`: every wait traps (a policy may not sleep or wait for anything: its call has
//!   a deadline, and a host call cannot be interrupted by one);
//! - no sockets, no name lookup: a module that imports them does not load.

use super::store::State;
use wasmtime::component::{HasData, Linker, Resource, ResourceTable};
use wasmtime_wasi::p2::bindings::sync::io::{poll, streams};
use wasmtime_wasi::p2::bindings::{cli, clocks, filesystem, random};
use wasmtime_wasi::p2::{StreamError, StreamResult};
use wasmtime_wasi::{cli::WasiCli, clocks::WasiClocks, filesystem::WasiFilesystem};
use wasmtime_wasi::{random::WasiRandom, random::WasiRandomView};
use wasmtime_wasi_io::bindings::wasi::io::streams::{
    HostInputStream as AsyncIn, HostOutputStream as AsyncOut,
};
use wasmtime_wasi_io::poll::DynPollable;
use wasmtime_wasi_io::streams::{DynInputStream, DynOutputStream};

/// The message of the trap a wait ends in.
pub const NO_WAITING: &str =
    "a policy may not wait (wasi:io/poll): it must answer within its deadline";

/// Link the WASI a policy gets into `linker`.
pub(super) fn add_to_linker(l: &mut Linker<State>) -> wasmtime::Result<()> {
    use wasmtime_wasi::cli::WasiCliView;
    use wasmtime_wasi::clocks::WasiClocksView;
    use wasmtime_wasi::filesystem::WasiFilesystemView;
    clocks::wall_clock::add_to_linker::<State, WasiClocks>(l, State::clocks)?;
    clocks::monotonic_clock::add_to_linker::<State, WasiClocks>(l, State::clocks)?;
    random::random::add_to_linker::<State, WasiRandom>(l, State::random)?;
    random::insecure::add_to_linker::<State, WasiRandom>(l, State::random)?;
    random::insecure_seed::add_to_linker::<State, WasiRandom>(l, State::random)?;
    cli::exit::add_to_linker::<State, WasiCli>(l, State::cli)?;
    cli::environment::add_to_linker::<State, WasiCli>(l, State::cli)?;
    cli::stdin::add_to_linker::<State, WasiCli>(l, State::cli)?;
    cli::stdout::add_to_linker::<State, WasiCli>(l, State::cli)?;
    cli::stderr::add_to_linker::<State, WasiCli>(l, State::cli)?;
    cli::terminal_input::add_to_linker::<State, WasiCli>(l, State::cli)?;
    cli::terminal_output::add_to_linker::<State, WasiCli>(l, State::cli)?;
    cli::terminal_stdin::add_to_linker::<State, WasiCli>(l, State::cli)?;
    cli::terminal_stdout::add_to_linker::<State, WasiCli>(l, State::cli)?;
    cli::terminal_stderr::add_to_linker::<State, WasiCli>(l, State::cli)?;
    filesystem::preopens::add_to_linker::<State, WasiFilesystem>(l, State::filesystem)?;
    wasmtime_wasi::p2::bindings::sync::filesystem::types::add_to_linker::<State, WasiFilesystem>(
        l,
        State::filesystem,
    )?;
    wasmtime_wasi_io::bindings::wasi::io::error::add_to_linker::<State, Io>(l, |s| {
        Tables(s.table())
    })?;
    poll::add_to_linker::<State, Io>(l, |s| Tables(s.table()))?;
    streams::add_to_linker::<State, Io>(l, |s| Tables(s.table()))?;
    Ok(())
}

/// The store's resource table, as the io interfaces see it.
pub(super) struct Tables<'a>(&'a mut ResourceTable);

struct Io;

impl HasData for Io {
    type Data<'a> = Tables<'a>;
}

impl wasmtime_wasi_io::bindings::wasi::io::error::Host for Tables<'_> {}

impl wasmtime_wasi_io::bindings::wasi::io::error::HostError for Tables<'_> {
    fn to_debug_string(
        &mut self,
        err: Resource<wasmtime_wasi_io::streams::Error>,
    ) -> wasmtime::Result<String> {
        wasmtime_wasi_io::bindings::wasi::io::error::HostError::to_debug_string(self.0, err)
    }

    fn drop(&mut self, err: Resource<wasmtime_wasi_io::streams::Error>) -> wasmtime::Result<()> {
        wasmtime_wasi_io::bindings::wasi::io::error::HostError::drop(self.0, err)
    }
}

impl poll::Host for Tables<'_> {
    fn poll(&mut self, _: Vec<Resource<DynPollable>>) -> wasmtime::Result<Vec<u32>> {
        Err(wasmtime::Error::msg(NO_WAITING))
    }
}

impl poll::HostPollable for Tables<'_> {
    fn ready(&mut self, _: Resource<DynPollable>) -> wasmtime::Result<bool> {
        Err(wasmtime::Error::msg(NO_WAITING))
    }

    fn block(&mut self, _: Resource<DynPollable>) -> wasmtime::Result<()> {
        Err(wasmtime::Error::msg(NO_WAITING))
    }

    fn drop(&mut self, pollable: Resource<DynPollable>) -> wasmtime::Result<()> {
        wasmtime_wasi_io::bindings::wasi::io::poll::HostPollable::drop(self.0, pollable)
    }
}

impl streams::Host for Tables<'_> {
    fn convert_stream_error(&mut self, err: StreamError) -> wasmtime::Result<streams::StreamError> {
        streams::Host::convert_stream_error(self.0, err)
    }
}

/// What `check-write` answers: a capture always takes a write (and drops what does not fit).
const ROOM: u64 = 4096;

/// Write as much of `bytes` as `stream` has room for now; drop the rest. Never waits.
fn write_what_fits(stream: &mut DynOutputStream, bytes: &[u8]) -> StreamResult<()> {
    let room = match stream.check_write() {
        Ok(n) => n,
        // A full or closed capture: the policy's output is dropped, not its call.
        Err(StreamError::Closed) => return Ok(()),
        Err(e) => return Err(e),
    };
    let take = room.min(bytes.len());
    if take > 0 {
        stream.write(wasmtime_wasi_io::bytes::Bytes::copy_from_slice(
            &bytes[..take],
        ))?;
    }
    stream.flush()
}

impl streams::HostOutputStream for Tables<'_> {
    fn drop(&mut self, stream: Resource<DynOutputStream>) -> wasmtime::Result<()> {
        self.0.delete(stream)?;
        Ok(())
    }

    /// Always room: what does not fit in the capture is dropped, never refused.
    fn check_write(&mut self, stream: Resource<DynOutputStream>) -> StreamResult<u64> {
        match AsyncOut::check_write(self.0, stream) {
            Ok(0) | Err(StreamError::Closed) => Ok(ROOM),
            other => other,
        }
    }

    fn write(&mut self, stream: Resource<DynOutputStream>, bytes: Vec<u8>) -> StreamResult<()> {
        write_what_fits(self.0.get_mut(&stream)?, &bytes)
    }

    fn blocking_write_and_flush(
        &mut self,
        stream: Resource<DynOutputStream>,
        bytes: Vec<u8>,
    ) -> StreamResult<()> {
        write_what_fits(self.0.get_mut(&stream)?, &bytes)
    }

    fn blocking_write_zeroes_and_flush(
        &mut self,
        stream: Resource<DynOutputStream>,
        len: u64,
    ) -> StreamResult<()> {
        let len = usize::try_from(len).unwrap_or(usize::MAX).min(1 << 16);
        write_what_fits(self.0.get_mut(&stream)?, &vec![0; len])
    }

    fn subscribe(
        &mut self,
        stream: Resource<DynOutputStream>,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        AsyncOut::subscribe(self.0, stream)
    }

    fn write_zeroes(&mut self, stream: Resource<DynOutputStream>, len: u64) -> StreamResult<()> {
        self.blocking_write_zeroes_and_flush(stream, len)
    }

    fn flush(&mut self, stream: Resource<DynOutputStream>) -> StreamResult<()> {
        self.0.get_mut(&stream)?.flush()
    }

    fn blocking_flush(&mut self, stream: Resource<DynOutputStream>) -> StreamResult<()> {
        self.0.get_mut(&stream)?.flush()
    }

    fn splice(
        &mut self,
        dst: Resource<DynOutputStream>,
        src: Resource<DynInputStream>,
        len: u64,
    ) -> StreamResult<u64> {
        AsyncOut::splice(self.0, dst, src, len)
    }

    /// What is there now: the only input is an empty stdin, and a policy does not wait.
    fn blocking_splice(
        &mut self,
        dst: Resource<DynOutputStream>,
        src: Resource<DynInputStream>,
        len: u64,
    ) -> StreamResult<u64> {
        self.splice(dst, src, len)
    }
}

impl streams::HostInputStream for Tables<'_> {
    fn drop(&mut self, stream: Resource<DynInputStream>) -> wasmtime::Result<()> {
        self.0.delete(stream)?;
        Ok(())
    }

    fn read(&mut self, stream: Resource<DynInputStream>, len: u64) -> StreamResult<Vec<u8>> {
        AsyncIn::read(self.0, stream, len)
    }

    /// Reads what is there (stdin is empty: closed at once); never waits for more.
    fn blocking_read(
        &mut self,
        stream: Resource<DynInputStream>,
        len: u64,
    ) -> StreamResult<Vec<u8>> {
        AsyncIn::read(self.0, stream, len)
    }

    fn skip(&mut self, stream: Resource<DynInputStream>, len: u64) -> StreamResult<u64> {
        AsyncIn::skip(self.0, stream, len)
    }

    fn blocking_skip(&mut self, stream: Resource<DynInputStream>, len: u64) -> StreamResult<u64> {
        AsyncIn::skip(self.0, stream, len)
    }

    fn subscribe(
        &mut self,
        stream: Resource<DynInputStream>,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        AsyncIn::subscribe(self.0, stream)
    }
}
