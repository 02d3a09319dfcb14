#pragma once
// A gate: what a module (or one of its parts) holds so that callbacks and coroutine resumptions
// arriving after it is gone are dropped instead of touching freed state. The pool, a timer, a
// kube call or a child process may complete after the module that started them was stopped
// and destroyed; their callbacks capture a ticket of the gate (not the module's lifetime), and
// run only while it is open.
//
// Loop-thread only, like the module state it guards: Close() and the checks run on the loop,
// so the flag needs no atomics (a foreign thread hands its result to the loop first, with
// Loop::Post, and the posted callback is guarded).
//
// A module, and each part with a lifetime of its own (a watcher, a stream, an endpoint that is
// replaced at runtime), holds a Gate member and closes it first thing in its destructor (so
// nothing guarded runs while its other members are being destroyed); destroying the Gate
// closes it too. The gate is the instance's, not its ModuleContext's: it closes exactly when the
// instance goes, whoever built it (the supervisor, a test) and whatever outlives it (the
// supervisor keeps an instance that did not stop in time, but not its context).

#include <concepts>
#include <memory>
#include <utility>

namespace gns {

class Gate {
 public:
  // A copyable view of a gate, held by callbacks: open while the gate is. A default-made
  // ticket belongs to no gate and is always open (for helpers whose gate is optional).
  class Ticket {
   public:
    Ticket() = default;
    bool IsOpen() const { return !open_ || *open_; }
    explicit operator bool() const { return IsOpen(); }

   private:
    friend class Gate;
    explicit Ticket(std::shared_ptr<const bool> open) : open_(std::move(open)) {}
    std::shared_ptr<const bool> open_;
  };

  Gate() = default;
  ~Gate() { Close(); }
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;

  // From now on, guarded callbacks do nothing and tickets read closed. Idempotent.
  void Close() { *open_ = false; }
  bool IsOpen() const { return *open_; }

  // Closes every ticket handed out so far and opens anew for what comes after: a Stop that
  // drops what is still in flight, a watcher stopped and started again.
  void Renew() {
    Close();
    open_ = std::make_shared<bool>(true);
  }

  Ticket Watch() const { return Ticket(open_); }

  // `fn` wrapped so that a call runs it only while the gate is open (a call after Close() is
  // dropped, whatever its arguments). Copyable when `fn` is; the result of `fn` is discarded.
  template <typename Fn>
  class Guarded {
   public:
    Guarded(std::shared_ptr<const bool> open, Fn fn) : open_(std::move(open)), fn_(std::move(fn)) {}
    template <typename... Args>
    void operator()(Args&&... args) {
      if (*open_) fn_(std::forward<Args>(args)...);
    }
    template <typename... Args>
      requires std::invocable<const Fn&, Args...>
    void operator()(Args&&... args) const {
      if (*open_) fn_(std::forward<Args>(args)...);
    }

   private:
    std::shared_ptr<const bool> open_;
    Fn fn_;
  };

  template <typename Fn>
  Guarded<Fn> Guard(Fn fn) const {
    return Guarded<Fn>(open_, std::move(fn));
  }

 private:
  std::shared_ptr<bool> open_ = std::make_shared<bool>(true);
};

}  // namespace gns
