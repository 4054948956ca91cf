//! Events, and graphs captured from a stream and replayed on it.

use std::fmt;

use cudarc::driver::sys;
use cudarc::driver::{CudaEvent, CudaGraph};

use super::device::Device;
use super::error::{check, CallContext, DriverError};
use super::stream::Stream;

impl Device {
    /// An event; `timing` makes it usable with [`Event::elapsed_ms`].
    pub fn new_event(&self, timing: bool) -> Result<Event, DriverError> {
        let flags = if timing {
            sys::CUevent_flags::CU_EVENT_DEFAULT
        } else {
            sys::CUevent_flags::CU_EVENT_DISABLE_TIMING
        };
        let event = self
            .context
            .new_event(Some(flags))
            .during("cuEventCreate", Some(self.ordinal))?;
        Ok(Event {
            ordinal: self.ordinal,
            event,
        })
    }
}

impl Stream {
    /// Records `event` at the current end of the stream.
    pub fn record(&self, event: &Event) -> Result<(), DriverError> {
        if event.ordinal != self.ordinal {
            return Err(DriverError::WrongDevice {
                what: "event".to_owned(),
                found: event.ordinal,
                expected: self.ordinal,
            });
        }
        self.bind()?;
        // SAFETY: the event is alive (borrowed) and of this stream's device (checked above);
        // the stream is alive and belongs to the current context.
        let result = unsafe { sys::cuEventRecord(event.event.cu_event(), self.raw) };
        check(result, "cuEventRecord", Some(self.ordinal))
    }

    /// Makes later work on this stream wait for `event` (which may be on another GPU).
    pub fn wait_for(&self, event: &Event) -> Result<(), DriverError> {
        self.bind()?;
        // SAFETY: the event and the stream are alive (borrowed, or kept alive by the caller
        // that lent the stream); the stream's context is current.
        let result = unsafe { sys::cuStreamWaitEvent(self.raw, event.event.cu_event(), 0) };
        check(result, "cuStreamWaitEvent", Some(self.ordinal))
    }

    /// Captures what `record` queues on the stream it is given (this one) into a graph.
    /// During capture only work that stays on the device can be queued (launches, fills,
    /// device copies, NCCL): a host copy fails the capture. The stream is borrowed exclusively
    /// so no other thread's work lands in the graph.
    pub fn capture<F, E>(&mut self, record: F) -> Result<Graph, E>
    where
        F: FnOnce(&Stream) -> Result<(), E>,
        E: From<DriverError>,
    {
        let owned = self.owned.clone().ok_or(DriverError::ForeignStream {
            device: self.ordinal,
        })?;
        owned
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .during("cuStreamBeginCapture", Some(self.ordinal))?;
        let recorded = record(self);
        let ended = owned
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .during("cuStreamEndCapture/cuGraphInstantiate", Some(self.ordinal));
        recorded?;
        let empty = || DriverError::EmptyCapture {
            device: self.ordinal,
        };
        let graph = ended?.ok_or_else(empty)?;
        let mut nodes = 0usize;
        // SAFETY: the graph is alive (owned by `graph`); a null node array asks only for the
        // count, written to a live local.
        let result =
            unsafe { sys::cuGraphGetNodes(graph.cu_graph(), std::ptr::null_mut(), &raw mut nodes) };
        check(result, "cuGraphGetNodes", Some(self.ordinal))?;
        // An empty graph is valid to CUDA, but a capture that queued nothing is a caller's bug.
        if nodes == 0 {
            return Err(empty().into());
        }
        Ok(Graph {
            ordinal: self.ordinal,
            graph,
        })
    }
}

/// An instantiated graph, replayed on the stream it was captured from. Its kernels hold device
/// addresses, not buffers: keep every buffer they use alive while the graph is replayed.
pub struct Graph {
    ordinal: usize,
    graph: CudaGraph,
}

impl fmt::Debug for Graph {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("Graph")
            .field("ordinal", &self.ordinal)
            .finish_non_exhaustive()
    }
}

impl Graph {
    /// Queues one replay.
    pub fn launch(&self) -> Result<(), DriverError> {
        self.graph
            .launch()
            .during("cuGraphLaunch", Some(self.ordinal))
    }

    /// Uploads the graph's resources so that the first replay costs no setup.
    pub fn upload(&self) -> Result<(), DriverError> {
        self.graph
            .upload()
            .during("cuGraphUpload", Some(self.ordinal))
    }
}

/// A CUDA event on one GPU.
#[derive(Debug)]
pub struct Event {
    ordinal: usize,
    event: CudaEvent,
}

impl Event {
    /// Waits until the work recorded before it is done.
    pub fn synchronize(&self) -> Result<(), DriverError> {
        self.event
            .synchronize()
            .during("cuEventSynchronize", Some(self.ordinal))
    }

    /// Milliseconds from this event to `end` (both created with timing, both recorded);
    /// waits for both.
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32, DriverError> {
        self.event
            .elapsed_ms(&end.event)
            .during("cuEventElapsedTime", Some(self.ordinal))
    }
}
