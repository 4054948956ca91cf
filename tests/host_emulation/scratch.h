// scratch.h: the kernels' scratch layouts as the host sizes them, mirrors of
// prepare::kernels::scratch_bytes. Included by harness.cc inside its anonymous namespace, after
// the element types (element_bytes, per_vector).
#pragma once

// Double-buffered layouts: a region of their own, after the shared one.
bool double_buffered(Scratch scratch) {
    return scratch == Scratch::DoubleBufferedLines ||
           scratch == Scratch::DoubleBufferedMessageSlots ||
           scratch == Scratch::DoubleBufferedSliceSlotsTwice;
}

u64 round_up(u64 value, u64 multiple) {
    return (value + multiple - 1) / multiple * multiple;
}

// Mirror of prepare::kernels::scratch_bytes.
u64 scratch_bytes(Scratch scratch, u64 world, u64 elements) {
    const u64 message = round_up(elements * element_bytes(), 16);
    const u64 slot = ((elements / per_vector() + world - 1) / world + 1) * 16;
    const u64 tight_slot = ((elements + per_vector() - 1) / per_vector() + world - 1) / world * 16;
    // Room for every message up to `elements` (a smaller one can take more lines).
    const u64 lines = 2 * (elements / per_vector()) + per_vector() - 1;
    const u64 chunk = PREPARE_DOUBLE_BUFFER_CHUNK_BYTES;
    switch (scratch) {
        case Scratch::None: return 0;
        case Scratch::Slice: return slot;
        case Scratch::Message: return message;
        case Scratch::PeerMessageSlots: return (world - 1) * message;
        case Scratch::PeerSliceSlotsThenMessage: return (world - 1) * slot + message;
        case Scratch::TwoMessages: return 2 * message;
        case Scratch::DoubleBufferedLines: return 2 * (world - 1) * round_up(lines * 16, chunk);
        case Scratch::DoubleBufferedMessageSlots:
            return 2 * (world - 1) * round_up(message, chunk);
        case Scratch::DoubleBufferedSliceSlotsTwice:
            return 2 * 2 * (world - 1) * round_up(tight_slot, chunk);
    }
    return 0;
}
