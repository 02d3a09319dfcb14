// Services and the module context's view of them (loop/services.hpp): a provider's view of a
// service for each module that finds it, the object itself outside any module.
#include "support/loop_harness.hpp"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>

namespace gns {
namespace {

struct Client {
  std::string agent;
};

TEST(ServicesTest, AModuleFindsItsOwnViewAndTheSharedSetFindsTheObject) {
  Services shared;
  auto object = std::make_shared<Client>(Client{"process"});
  auto views = std::make_shared<std::map<std::string, std::shared_ptr<Client>>>();
  shared.Provide<Client>(object, [views](const std::string& holder) {
    auto& view = (*views)[holder];
    if (!view) view = std::make_shared<Client>(Client{"process/" + holder});
    return view;
  });
  EXPECT_EQ(shared.Find<Client>(), object);

  Services a(shared, "gkm-agent");
  Services b(shared, "pod-resources");
  ASSERT_TRUE(a.Find<Client>());
  EXPECT_EQ(a.Find<Client>()->agent, "process/gkm-agent");
  EXPECT_EQ(b.Find<Client>()->agent, "process/pod-resources");
  EXPECT_EQ(a.Find<Client>(), a.Find<Client>()) << "the provider hands the same view out again";
  EXPECT_EQ(a.Holder(), "gkm-agent");

  // Provided without a view: every holder finds the object. Provide and Withdraw through a
  // module's view act on the shared set.
  auto plain = std::make_shared<int>(7);
  a.Provide<int>(plain);
  EXPECT_EQ(shared.Find<int>(), plain);
  EXPECT_EQ(b.Find<int>(), plain);
  b.Withdraw<Client>();
  EXPECT_EQ(shared.Find<Client>(), nullptr);
  EXPECT_EQ(a.Find<Client>(), nullptr);
}

TEST(ServicesTest, AModuleContextFindsThroughAViewNamingTheModule) {
  test::LoopHarness h;
  h.services.Provide<Client>(std::make_shared<Client>(Client{"process"}), [](const std::string& holder) {
    return std::make_shared<Client>(Client{"process/" + holder});
  });
  ModuleContext context(h.Parts(), "gpu-reset", [](std::string) {}, [](ModuleHealth, std::string) {});
  ASSERT_TRUE(context.GetServices().Find<Client>());
  EXPECT_EQ(context.GetServices().Find<Client>()->agent, "process/gpu-reset");
  EXPECT_EQ(h.services.Find<Client>()->agent, "process");
}

}  // namespace
}  // namespace gns
