// The OS threads that run the emulated CUDA threads (harness.cc).
#pragma once
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

// An OS thread that runs one emulated CUDA thread at a time. Starting a thread per emulated
// thread per launch cost most of a run's time (the kernel's thread setup and teardown); a
// launch's threads are taken from those that finished earlier launches instead, each still
// on a thread of its own while the launch runs. A task is handed over and its end reported
// under the worker's mutex, so it happens after what preceded its start and before what
// follows its join, as with a thread started and joined.
class Worker {
  public:
    // Runs `task` on an idle worker, or on a new one when none is idle.
    static Worker* start(std::function<void()> task) {
        Worker* worker = nullptr;
        {
            std::lock_guard<std::mutex> lock(idle_mutex());
            if (!idle().empty()) {
                worker = idle().back();
                idle().pop_back();
            }
        }
        if (worker == nullptr) {
            // Never destroyed: a worker waits for its next task until the process exits.
            worker = new Worker;
            std::thread(&Worker::serve, worker).detach();
        }
        std::lock_guard<std::mutex> lock(worker->mutex_);
        worker->task_ = std::move(task);
        worker->changed_.notify_all();
        return worker;
    }

    // Waits until the task has returned; the worker then takes the next one.
    void join() {
        {
            std::unique_lock<std::mutex> lock(mutex_);
            changed_.wait(lock, [this] { return !task_; });
        }
        std::lock_guard<std::mutex> lock(idle_mutex());
        idle().push_back(this);
    }

  private:
    void serve() {
        std::unique_lock<std::mutex> lock(mutex_);
        for (;;) {
            changed_.wait(lock, [this] { return static_cast<bool>(task_); });
            lock.unlock();
            task_();
            lock.lock();
            task_ = nullptr;
            changed_.notify_all();
        }
    }

    static std::mutex& idle_mutex() {
        static std::mutex mutex;
        return mutex;
    }
    static std::vector<Worker*>& idle() {
        static std::vector<Worker*> workers;
        return workers;
    }

    std::mutex mutex_;
    std::condition_variable changed_;
    std::function<void()> task_;
};
