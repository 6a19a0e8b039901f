#include "conv_graph.hpp"

namespace fdnn_cudnn {
namespace {

DescPtr make_tensor(int64_t uid, const Geometry& g, const ConvProblem& p) {
  DescPtr t = make_desc(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  t->set_dtype(CUDNN_ATTR_TENSOR_DATA_TYPE, p.dtype);
  t->set_int64s(CUDNN_ATTR_TENSOR_DIMENSIONS, g.dims);
  t->set_int64s(CUDNN_ATTR_TENSOR_STRIDES, g.strides);
  t->set_int64(CUDNN_ATTR_TENSOR_UNIQUE_ID, uid);
  t->set_int64(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, p.alignment);
  t->finalize("tensor");
  return t;
}

DescPtr make_conv_desc(const ConvProblem& p) {
  DescPtr c = make_desc(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;  // torch semantics
  c->set_dtype(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, p.compute);
  c->set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
  c->set_int64(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, static_cast<int64_t>(p.stride.size()));
  c->set_int64s(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, p.stride);
  c->set_int64s(CUDNN_ATTR_CONVOLUTION_DILATIONS, p.dilation);
  c->set_int64s(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, p.pad_lo);
  c->set_int64s(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, p.pad_hi);
  c->finalize("convolution");
  return c;
}

// The attribute names of each op's operands, in x, w, y, conv, alpha, beta order.
struct OpAttributes {
  cudnnBackendDescriptorType_t type;
  cudnnBackendAttributeName_t x, w, y, conv, alpha, beta;
};

OpAttributes op_attributes(FDNN_ConvOp op) {
  switch (op) {
    case FDNN_CONV_FORWARD:
      return {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA};
    case FDNN_CONV_BACKWARD_DATA:
      return {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA};
    case FDNN_CONV_BACKWARD_WEIGHT:
      break;
  }
  return {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA};
}

}  // namespace

ConvGraph build_conv_graph(const ConvProblem& p, ConvScales scales, cudnnHandle_t handle) {
  ConvGraph g;
  DescPtr x = make_tensor(kUidX, p.x, p);
  DescPtr w = make_tensor(kUidW, p.w, p);
  DescPtr y = make_tensor(kUidY, p.y, p);
  DescPtr conv = make_conv_desc(p);
  OpAttributes names = op_attributes(p.op);
  DescPtr op = make_desc(names.type);
  op->set_desc(names.x, *x);
  op->set_desc(names.w, *w);
  op->set_desc(names.y, *y);
  op->set_desc(names.conv, *conv);
  op->set_scale(names.alpha, scales.alpha, p.is_double());
  op->set_scale(names.beta, scales.beta, p.is_double());
  op->finalize("convolution operation");

  g.graph = make_desc(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  cudnnBackendDescriptor_t ops[] = {op->get()};
  g.graph->set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, ops);
  g.graph->set_handle(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, handle);
  g.graph->finalize("operation graph");
  g.parts = {x, w, y, conv, op};
  return g;
}

}  // namespace fdnn_cudnn
