// The simulated platform connector: see platform_connector_sim.h.
#include "platform_connector_sim.h"

#include "nvsentinel/v1/api.grpc.pb.h"

#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>

#include <fstream>
#include <stdexcept>
#include <thread>

namespace gns::sim {

class PlatformConnectorSim::Service final : public datamodels::PlatformConnector::Service {
 public:
  explicit Service(PlatformConnectorSim& sim) : sim_(sim) {}
  grpc::Status HealthEventOccurredV1(grpc::ServerContext*, const datamodels::HealthEvents* request,
                                     google::protobuf::Empty*) override {
    const uint64_t call = ++sim_.calls_;
    if (const int64_t delay = sim_.delay_ms_; delay > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay));
    if (sim_.failing_) {
      ++sim_.failed_calls_;
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "platform connector simulator: failing on request");
    }
    std::vector<Received> events;
    google::protobuf::util::JsonPrintOptions options;
    options.preserve_proto_field_names = true;
    for (const auto& event : request->events()) {
      Received r;
      r.call = call;
      r.id = event.id();
      r.check_name = event.checkname();
      r.is_healthy = event.ishealthy();
      if (!google::protobuf::util::MessageToJsonString(event, &r.json, options).ok()) r.json = "{}";
      events.push_back(std::move(r));
    }
    sim_.Record(call, events);
    return grpc::Status::OK;
  }

 private:
  PlatformConnectorSim& sim_;
};

struct PlatformConnectorSim::Server {
  std::unique_ptr<grpc::Server> server;
};

PlatformConnectorSim::PlatformConnectorSim(std::filesystem::path socket, std::filesystem::path record)
    : socket_(std::move(socket)), record_(std::move(record)) {
  std::error_code ec;
  std::filesystem::remove(socket_, ec);  // a stale socket of an earlier run
  service_ = std::make_unique<Service>(*this);
  server_ = std::make_unique<Server>();
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + socket_.string(), grpc::InsecureServerCredentials());
  builder.RegisterService(service_.get());
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::NUM_CQS, 1);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MIN_POLLERS, 1);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, 2);
  server_->server = builder.BuildAndStart();
  if (!server_->server) throw std::runtime_error("cannot serve " + socket_.string());
}

PlatformConnectorSim::~PlatformConnectorSim() {
  server_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  server_->server->Wait();
  std::error_code ec;
  std::filesystem::remove(socket_, ec);
}

void PlatformConnectorSim::Record(uint64_t call, const std::vector<Received>& events) {
  std::lock_guard lock(mutex_);
  if (!record_.empty()) {
    std::ofstream out(record_, std::ios::app);
    const auto now = std::chrono::duration_cast<std::chrono::milliseconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
    for (const auto& e : events) {
      out << "{\"call\":" << call << ",\"receivedUnixMs\":" << now << ",\"event\":" << e.json << "}\n";
    }
    out.flush();
  }
  events_.insert(events_.end(), events.begin(), events.end());
}

std::vector<PlatformConnectorSim::Received> PlatformConnectorSim::Events() const {
  std::lock_guard lock(mutex_);
  return events_;
}

}  // namespace gns::sim
