#pragma once
// Extraction that follows a pull: the registry client hands each chunk of a layer to it as the
// chunk arrives, and one job on the blocking pool reads the chunks through libarchive
// (Extractor: every entry checked as in extract.hpp) into a staging directory while the next
// chunk is still on the wire. Pull and extraction overlap, and the layer is never written to
// disk as a blob: the bytes are written once, as files of the cache.
//
// The extraction job also hashes every byte of a layer (also the padding after the archive's
// end, which libarchive does not read), so the digest the layer is checked against is the one
// of the bytes received. Files of a layer whose digest turns out wrong are already in the
// staging directory by then: the caller installs the directory only after a pull that
// succeeded, and removes it otherwise.
//
// Buffers are the caller's: a chunk handed over stays the caller's memory, read by the job
// until `released` runs (libarchive may hold a chunk until it asks for the next one). With two
// chunk buffers a pull holds two chunks, whatever the size of the layer.
//
// The job holds one pool thread while the pull streams, and waits only for the loop's chunks:
// nothing the pull does waits for the pool meanwhile, so a pool of one thread is slow for
// others during a pull but never deadlocks.

#include "loop/blocking_pool.hpp"
#include "loop/loop.hpp"
#include "modules/gkm_agent/extract.hpp"

#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <string>

namespace gns::gkm {

class StreamingExtraction {
 public:
  // Extracts into `dest` (created by the job; it must not exist) up to `max_bytes` of files.
  StreamingExtraction(Loop& loop, BlockingPool& pool, std::string dest, uint64_t max_bytes);
  // Aborts a job still running (see Abort).
  ~StreamingExtraction();
  StreamingExtraction(const StreamingExtraction&) = delete;
  StreamingExtraction& operator=(const StreamingExtraction&) = delete;

  // Everything below is called on the loop thread, in this order per layer: BeginLayer, Feed…,
  // EndLayer; Finish after the last layer. Every completion runs on the loop, exactly once.

  // Starts the next layer (and the pool job, with the first); `where` names it in errors.
  void BeginLayer(std::string where);
  // Hands over [data, data + n). `released` runs once the job no longer reads that memory.
  void Feed(const char* data, std::size_t n, std::function<void()> released);
  // Ends the layer: `done(digest, error)` once each of its bytes was hashed and what its archive
  // holds extracted; `error` (a PullError) says why the extraction failed, if it did. After an
  // error the job still hashes later layers' bytes, but extracts nothing more.
  void EndLayer(std::function<void(std::string digest, std::exception_ptr error)> done);
  // Closes and flushes the tree: `done(stats, error)`.
  void Finish(std::function<void(ExtractStats, std::exception_ptr)> done);
  // Stops the job (a failed or stopped pull); `ended` runs once the job has released every
  // chunk and will write nothing more (at once when it has ended or never started). Chunks
  // not read are released; an EndLayer or Finish not answered yet is answered with a
  // PullError "Stopped", as is any call after Abort.
  void Abort(std::function<void()> ended);

  struct State;

 private:
  Loop& loop_;
  BlockingPool& pool_;
  std::shared_ptr<State> state_;
};

}  // namespace gns::gkm
