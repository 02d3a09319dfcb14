// Extraction that follows a pull (see streaming_extraction.hpp).
#include "modules/gkm_agent/streaming_extraction.hpp"

#include "modules/gkm_agent/image.hpp"

#include <archive.h>
#include <openssl/evp.h>

#include <array>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>

namespace gns::gkm {

namespace {

enum class Kind { kBegin, kChunk, kEnd, kFinish };

struct Item {
  Kind kind = Kind::kChunk;
  const char* data = nullptr;
  std::size_t n = 0;
  std::function<void()> released;  // kChunk
  std::string where;               // kBegin
  std::function<void(std::string, std::exception_ptr)> end_done;
  std::function<void(ExtractStats, std::exception_ptr)> finish_done;
};

struct ReaderFree {
  void operator()(archive* a) const { archive_read_free(a); }
};

}  // namespace

struct StreamingExtraction::State {
  State(Loop& l, std::string d, uint64_t max) : loop(l), dest(std::move(d)), max_bytes(max) {}
  ~State() {
    if (md) EVP_MD_CTX_free(md);
  }

  Loop& loop;
  const std::string dest;
  const uint64_t max_bytes;

  // Shared between the loop and the job.
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Item> queue;
  bool aborted = false;
  bool ended = false;  // the job has released everything and returned
  std::function<void()> on_ended;

  // The loop's alone.
  bool started = false;

  // The job's alone.
  EVP_MD_CTX* md = nullptr;
  std::optional<Item> reading;  // the chunk libarchive may still point into
  std::optional<Item> layer_end;

  // An item the job will not take: its completion runs all the same (a chunk released, an end
  // or finish with "Stopped"), so whoever waits on it is woken on the loop.
  void Cancel(Item& item) {
    const auto stopped = std::make_exception_ptr(PullError("Stopped", "extraction stopped"));
    if (item.released) loop.Post(std::move(item.released));
    if (item.end_done) loop.Post([done = std::move(item.end_done), stopped]() mutable { done({}, stopped); });
    if (item.finish_done) loop.Post([done = std::move(item.finish_done), stopped]() mutable { done({}, stopped); });
  }

  // Queues `item` for the job, or cancels it when the job has stopped.
  void Push(Item item) {
    std::lock_guard lock(mu);
    if (ended || aborted) {
      Cancel(item);
      return;
    }
    queue.push_back(std::move(item));
    cv.notify_all();
  }

  // The next item, or nothing once aborted.
  std::optional<Item> Take() {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return aborted || !queue.empty(); });
    if (aborted) return std::nullopt;
    Item item = std::move(queue.front());
    queue.pop_front();
    return item;
  }

  void ReleaseReading() {
    if (reading) {
      loop.Post(std::move(reading->released));
      reading.reset();
    }
  }

  // The layer's next chunk, hashed, for libarchive (or the drain): its size, 0 at the layer's
  // end, -1 once aborted.
  la_ssize_t NextChunk(const void** buffer) {
    ReleaseReading();
    if (layer_end) return 0;
    for (;;) {
      auto item = Take();
      if (!item) return -1;
      if (item->kind == Kind::kEnd) {
        layer_end = std::move(item);
        return 0;
      }
      if (item->kind != Kind::kChunk) {  // the loop keeps the order; nothing else comes here
        Cancel(*item);
        continue;
      }
      EVP_DigestUpdate(md, item->data, item->n);
      *buffer = item->data;
      const auto n = static_cast<la_ssize_t>(item->n);
      reading = std::move(item);
      if (n > 0) return n;
      ReleaseReading();  // an empty chunk is no end: read on
    }
  }

  static la_ssize_t Read(archive* a, void* self, const void** buffer) {
    auto* s = static_cast<State*>(self);
    const la_ssize_t n = s->NextChunk(buffer);
    if (n < 0) archive_set_error(a, ECANCELED, "extraction stopped");
    return n;
  }


  // One layer: extracted (unless an earlier one failed), then drained to its end and hashed.
  // False once aborted.
  bool Layer(Extractor* extractor, const std::string& where, std::exception_ptr& failure) {
    EVP_DigestInit_ex(md, EVP_sha256(), nullptr);
    layer_end.reset();
    std::exception_ptr error = failure;
    if (!failure && extractor) {
      std::unique_ptr<archive, ReaderFree> in(Extractor::NewLayerReader());
      try {
        if (archive_read_open(in.get(), this, nullptr, &State::Read, nullptr) != ARCHIVE_OK) {
          const char* why = archive_error_string(in.get());
          throw PullError("BadArchive", where + ": " + (why ? why : "not an archive"));
        }
        extractor->Layer(in.get(), where);
      } catch (...) {
        error = std::current_exception();
      }
    }
    // Whatever the archive left unread (the padding after its end, or all of it after an
    // error) is hashed too: the digest is the digest of what came.
    const void* ignored = nullptr;
    for (;;) {
      const la_ssize_t n = NextChunk(&ignored);
      if (n < 0) return false;
      if (n == 0) break;
    }
    ReleaseReading();
    if (error && !failure) failure = error;
    loop.Post([done = std::move(layer_end->end_done), digest = FinishSha256Digest(md), error]() mutable { done(digest, error); });
    layer_end.reset();
    return true;
  }

  void Run() {
    md = EVP_MD_CTX_new();
    std::exception_ptr failure;
    std::unique_ptr<Extractor> extractor;
    try {
      extractor = std::make_unique<Extractor>(dest, max_bytes);
    } catch (...) {
      failure = std::current_exception();
    }
    for (;;) {
      auto item = Take();
      if (!item) break;
      if (item->kind == Kind::kBegin) {
        if (!Layer(extractor.get(), item->where, failure)) break;
      } else if (item->kind == Kind::kFinish) {
        ExtractStats stats;
        std::exception_ptr error = failure;
        if (!error) {
          try {
            stats = extractor->Finish();
          } catch (...) {
            error = std::current_exception();
          }
        }
        loop.Post([done = std::move(item->finish_done), stats, error]() mutable { done(stats, error); });
        break;
      } else {
        Cancel(*item);  // outside a layer: the loop broke the order
      }
    }
    ReleaseReading();
    if (layer_end) Cancel(*layer_end);
    extractor.reset();  // closes what libarchive still had open; nothing is written after this
    std::lock_guard lock(mu);
    for (auto& item : queue) Cancel(item);
    queue.clear();
    ended = true;
    if (on_ended) loop.Post(std::move(on_ended));
  }
};

StreamingExtraction::StreamingExtraction(Loop& loop, BlockingPool& pool, std::string dest, uint64_t max_bytes)
    : loop_(loop), pool_(pool), state_(std::make_shared<State>(loop, std::move(dest), max_bytes)) {}

StreamingExtraction::~StreamingExtraction() {
  std::lock_guard lock(state_->mu);
  state_->aborted = true;
  state_->cv.notify_all();
}

void StreamingExtraction::BeginLayer(std::string where) {
  if (!state_->started) {
    state_->started = true;
    pool_.Execute([state = state_] { state->Run(); });
  }
  Item item;
  item.kind = Kind::kBegin;
  item.where = std::move(where);
  state_->Push(std::move(item));
}

void StreamingExtraction::Feed(const char* data, std::size_t n, std::function<void()> released) {
  Item item;
  item.kind = Kind::kChunk;
  item.data = data;
  item.n = n;
  item.released = std::move(released);
  state_->Push(std::move(item));
}

void StreamingExtraction::EndLayer(std::function<void(std::string, std::exception_ptr)> done) {
  Item item;
  item.kind = Kind::kEnd;
  item.end_done = std::move(done);
  state_->Push(std::move(item));
}

void StreamingExtraction::Finish(std::function<void(ExtractStats, std::exception_ptr)> done) {
  Item item;
  item.kind = Kind::kFinish;
  item.finish_done = std::move(done);
  state_->Push(std::move(item));
}

void StreamingExtraction::Abort(std::function<void()> ended) {
  std::lock_guard lock(state_->mu);
  if (state_->ended || !state_->started) {
    for (auto& item : state_->queue) state_->Cancel(item);
    state_->queue.clear();
    state_->aborted = true;
    if (ended) loop_.Post(std::move(ended));
    return;
  }
  state_->aborted = true;
  state_->on_ended = std::move(ended);
  state_->cv.notify_all();
}

}  // namespace gns::gkm
