// FOR THE LINUX SYNTAX CHECK ONLY (.ci/mps.sh), never used in a real build: the
// MetalPerformanceShadersGraph interfaces the MPS shim uses, with the signatures, enum
// values, availability and nullability of Apple's headers. Only what the shim calls. Where
// each comes from (Apple's headers as mirrored publicly; "12.0 SDK" is phracker/MacOSX-SDKs
// MacOSX12.0.sdk, "iOS 18.2 SDK" is xybp888/iOS-SDKs iPhoneOS18.2.1.sdk, whose MPSGraph
// headers carry the macOS availability too):
//   MPSGraph.h (12.0 SDK): MPSGraph (macOS 11.0); MPSGraphCompilationDescriptor (12.0);
//     -compileWithDevice:feeds:targetTensors:targetOperations:compilationDescriptor: (12.0;
//     device, targetOperations and compilationDescriptor _Nullable; returns nonnull).
//   MPSGraphExecutable.h (12.0 SDK): MPSGraphExecutable and
//     MPSGraphExecutableExecutionDescriptor (12.0); feedTensors and targetTensors nullable;
//     -encodeToCommandBuffer:inputsArray:resultsArray:executionDescriptor: (resultsArray and
//     executionDescriptor _Nullable).
//   MPSGraphTensorData.h (iOS 18.2 SDK): class macOS 11.0; -initWithMTLBuffer:shape:dataType:
//     (no offset parameter), -initWithMPSNDArray:.
//   MPSGraphTensorShapeOps.h (12.0 SDK): reshapeTensor:withShape:name: (11.0),
//     castTensor:toType:name: (12.0, name NOT nullable); transposeTensor:permutation:name:
//     (13.0, per the review's reading of an iOS 17/18 SDK mirror).
//   MPSGraphActivationOps.h (iOS 18.2 SDK): reLU, sigmoid (11.0); leakyReLUWithTensor:alpha:
//     name: (12.0).
//   MPSGraphScatterNDOps.h (12.0 SDK): scatterWithDataTensor:updatesTensor:indicesTensor:
//     axis:mode:name: (12.0); MPSGraphCore.h: MPSGraphScatterMode (Set = 6),
//     MPSGraphPaddingStyle, MPSGraphTensorNamedDataLayout (NCDHW 7 .. DHWIO 10 from 13.2).
//   MPSGraphConvolutionOps.h (iOS 18.2 SDK): the 2-D descriptor and ops (11.0), the 3-D
//     descriptor and ops (13.2), argument order and types as below.
//   Not re-read for issue 27 (the review compared them by eye): MPSGraphMemoryOps.h
//     (placeholder, constants), MPSGraphGatherOps.h, MPSGraphArithmeticOps.h (add, multiply,
//     clamp, tanh, erf), MPSGraphReductionOps.h, MPSGraphDevice.h; declared 11.0 here.
#pragma once

#import <MetalPerformanceShaders/MetalPerformanceShaders.h>

NS_ASSUME_NONNULL_BEGIN

typedef enum : NSUInteger {
  MPSGraphTensorNamedDataLayoutNCHW = 0,
  MPSGraphTensorNamedDataLayoutNHWC = 1,
  MPSGraphTensorNamedDataLayoutOIHW = 2,
  MPSGraphTensorNamedDataLayoutHWIO = 3,
  MPSGraphTensorNamedDataLayoutCHW = 4,
  MPSGraphTensorNamedDataLayoutHWC = 5,
  MPSGraphTensorNamedDataLayoutHW = 6,
  MPSGraphTensorNamedDataLayoutNCDHW API_AVAILABLE(macos(13.2)) = 7,
  MPSGraphTensorNamedDataLayoutNDHWC API_AVAILABLE(macos(13.2)) = 8,
  MPSGraphTensorNamedDataLayoutOIDHW API_AVAILABLE(macos(13.2)) = 9,
  MPSGraphTensorNamedDataLayoutDHWIO API_AVAILABLE(macos(13.2)) = 10,
} MPSGraphTensorNamedDataLayout;

typedef enum : NSUInteger {
  MPSGraphPaddingStyleExplicit = 0,
  MPSGraphPaddingStyleTF_VALID = 1,
  MPSGraphPaddingStyleTF_SAME = 2,
  MPSGraphPaddingStyleExplicitOffset = 3,
  MPSGraphPaddingStyleONNX_SAME_LOWER API_AVAILABLE(macos(14.0)) = 4,
} MPSGraphPaddingStyle;

typedef enum : NSInteger {
  MPSGraphScatterModeAdd = 0,
  MPSGraphScatterModeSub = 1,
  MPSGraphScatterModeMul = 2,
  MPSGraphScatterModeDiv = 3,
  MPSGraphScatterModeMin = 4,
  MPSGraphScatterModeMax = 5,
  MPSGraphScatterModeSet = 6,
} MPSGraphScatterMode;

@class MPSGraphOperation;

@interface MPSGraphObject : NSObject
@end

@interface MPSGraphType : MPSGraphObject <NSCopying>
@end

@interface MPSGraphShapedType : MPSGraphType
- (instancetype)initWithShape:(MPSShape*)shape dataType:(MPSDataType)dataType;
@property(readwrite, copy) MPSShape* shape;
@property(readwrite, assign) MPSDataType dataType;
@end

@interface MPSGraphTensor : MPSGraphObject <NSCopying>
@property(readonly, copy, nullable) MPSShape* shape;
@property(readonly) MPSDataType dataType;
@property(readonly) MPSGraphOperation* operation;
@end

@interface MPSGraphOperation : MPSGraphObject <NSCopying>
@end

@interface MPSGraphTensorData : MPSGraphObject
- (instancetype)initWithMTLBuffer:(id<MTLBuffer>)buffer shape:(MPSShape*)shape dataType:(MPSDataType)dataType;
- (instancetype)initWithMPSNDArray:(MPSNDArray*)ndarray;
@end

@interface MPSGraphDevice : MPSGraphObject
+ (instancetype)deviceWithMTLDevice:(id<MTLDevice>)metalDevice;
@end

API_AVAILABLE(macos(12.0))
@interface MPSGraphCompilationDescriptor : MPSGraphObject <NSCopying>
@end

API_AVAILABLE(macos(12.0))
@interface MPSGraphExecutableExecutionDescriptor : MPSGraphObject
@property(readwrite, atomic) BOOL waitUntilCompleted;
@end

typedef NSDictionary<MPSGraphTensor*, MPSGraphShapedType*> MPSGraphTensorShapedTypeDictionary;

API_AVAILABLE(macos(12.0))
@interface MPSGraphExecutable : MPSGraphObject
@property(readonly, atomic, nullable) NSArray<MPSGraphTensor*>* feedTensors;
@property(readonly, atomic, nullable) NSArray<MPSGraphTensor*>* targetTensors;
- (NSArray<MPSGraphTensorData*>*)encodeToCommandBuffer:(MPSCommandBuffer*)commandBuffer
                                           inputsArray:(NSArray<MPSGraphTensorData*>*)inputsArray
                                          resultsArray:(NSArray<MPSGraphTensorData*>* _Nullable)resultsArray
                                   executionDescriptor:
                                       (MPSGraphExecutableExecutionDescriptor* _Nullable)executionDescriptor;
@end

@interface MPSGraphConvolution2DOpDescriptor : MPSGraphObject <NSCopying>
@property(readwrite, nonatomic) NSUInteger strideInX;
@property(readwrite, nonatomic) NSUInteger strideInY;
@property(readwrite, nonatomic) NSUInteger dilationRateInX;
@property(readwrite, nonatomic) NSUInteger dilationRateInY;
@property(readwrite, nonatomic) NSUInteger paddingLeft;
@property(readwrite, nonatomic) NSUInteger paddingRight;
@property(readwrite, nonatomic) NSUInteger paddingTop;
@property(readwrite, nonatomic) NSUInteger paddingBottom;
@property(readwrite, nonatomic) MPSGraphPaddingStyle paddingStyle;
@property(readwrite, nonatomic) MPSGraphTensorNamedDataLayout dataLayout;
@property(readwrite, nonatomic) MPSGraphTensorNamedDataLayout weightsLayout;
@property(readwrite, nonatomic) NSUInteger groups;
@end

API_AVAILABLE(macos(13.2))
@interface MPSGraphConvolution3DOpDescriptor : MPSGraphObject <NSCopying>
@property(readwrite, nonatomic) NSUInteger strideInX;
@property(readwrite, nonatomic) NSUInteger strideInY;
@property(readwrite, nonatomic) NSUInteger strideInZ;
@property(readwrite, nonatomic) NSUInteger dilationRateInX;
@property(readwrite, nonatomic) NSUInteger dilationRateInY;
@property(readwrite, nonatomic) NSUInteger dilationRateInZ;
@property(readwrite, nonatomic) NSUInteger paddingLeft;
@property(readwrite, nonatomic) NSUInteger paddingRight;
@property(readwrite, nonatomic) NSUInteger paddingTop;
@property(readwrite, nonatomic) NSUInteger paddingBottom;
@property(readwrite, nonatomic) NSUInteger paddingFront;
@property(readwrite, nonatomic) NSUInteger paddingBack;
@property(readwrite, nonatomic) MPSGraphPaddingStyle paddingStyle;
@property(readwrite, nonatomic) MPSGraphTensorNamedDataLayout dataLayout;
@property(readwrite, nonatomic) MPSGraphTensorNamedDataLayout weightsLayout;
@property(readwrite, nonatomic) NSUInteger groups;
@end

@interface MPSGraph : MPSGraphObject
+ (instancetype)new;

// MPSGraph.h
- (MPSGraphExecutable*)compileWithDevice:(MPSGraphDevice* _Nullable)device
                                   feeds:(MPSGraphTensorShapedTypeDictionary*)feeds
                           targetTensors:(NSArray<MPSGraphTensor*>*)targetTensors
                        targetOperations:(NSArray<MPSGraphOperation*>* _Nullable)targetOperations
                   compilationDescriptor:(MPSGraphCompilationDescriptor* _Nullable)compilationDescriptor
    API_AVAILABLE(macos(12.0));

// MPSGraphMemoryOps.h
- (MPSGraphTensor*)placeholderWithShape:(MPSShape*)shape dataType:(MPSDataType)dataType name:(NSString* _Nullable)name;
- (MPSGraphTensor*)constantWithData:(NSData*)data shape:(MPSShape*)shape dataType:(MPSDataType)dataType;
- (MPSGraphTensor*)constantWithScalar:(double)scalar dataType:(MPSDataType)dataType;

// MPSGraphTensorShapeOps.h
- (MPSGraphTensor*)reshapeTensor:(MPSGraphTensor*)tensor withShape:(MPSShape*)shape name:(NSString* _Nullable)name;
- (MPSGraphTensor*)transposeTensor:(MPSGraphTensor*)tensor
                       permutation:(NSArray<NSNumber*>*)permutation
                              name:(NSString* _Nullable)name API_AVAILABLE(macos(13.0));
- (MPSGraphTensor*)castTensor:(MPSGraphTensor*)tensor
                       toType:(MPSDataType)type
                         name:(NSString*)name API_AVAILABLE(macos(12.0));  // name: nonnull

// MPSGraphGatherOps.h, MPSGraphScatterOps.h
- (MPSGraphTensor*)gatherWithUpdatesTensor:(MPSGraphTensor*)updatesTensor
                             indicesTensor:(MPSGraphTensor*)indicesTensor
                                      axis:(NSUInteger)axis
                           batchDimensions:(NSUInteger)batchDimensions
                                      name:(NSString* _Nullable)name;
- (MPSGraphTensor*)scatterWithDataTensor:(MPSGraphTensor*)dataTensor
                           updatesTensor:(MPSGraphTensor*)updatesTensor
                           indicesTensor:(MPSGraphTensor*)indicesTensor
                                    axis:(NSInteger)axis
                                    mode:(MPSGraphScatterMode)mode
                                    name:(NSString* _Nullable)name API_AVAILABLE(macos(12.0));

// MPSGraphArithmeticOps.h, MPSGraphActivationOps.h, MPSGraphReductionOps.h
- (MPSGraphTensor*)additionWithPrimaryTensor:(MPSGraphTensor*)primaryTensor
                             secondaryTensor:(MPSGraphTensor*)secondaryTensor
                                        name:(NSString* _Nullable)name;
- (MPSGraphTensor*)multiplicationWithPrimaryTensor:(MPSGraphTensor*)primaryTensor
                                   secondaryTensor:(MPSGraphTensor*)secondaryTensor
                                              name:(NSString* _Nullable)name;
- (MPSGraphTensor*)clampWithTensor:(MPSGraphTensor*)tensor
                    minValueTensor:(MPSGraphTensor*)minValueTensor
                    maxValueTensor:(MPSGraphTensor*)maxValueTensor
                              name:(NSString* _Nullable)name;
- (MPSGraphTensor*)tanhWithTensor:(MPSGraphTensor*)tensor name:(NSString* _Nullable)name;
- (MPSGraphTensor*)erfWithTensor:(MPSGraphTensor*)tensor name:(NSString* _Nullable)name;
- (MPSGraphTensor*)reLUWithTensor:(MPSGraphTensor*)tensor name:(NSString* _Nullable)name;
- (MPSGraphTensor*)sigmoidWithTensor:(MPSGraphTensor*)tensor name:(NSString* _Nullable)name;
- (MPSGraphTensor*)leakyReLUWithTensor:(MPSGraphTensor*)tensor
                                 alpha:(double)alpha
                                  name:(NSString* _Nullable)name API_AVAILABLE(macos(12.0));
- (MPSGraphTensor*)reductionSumWithTensor:(MPSGraphTensor*)tensor
                                     axes:(NSArray<NSNumber*>*)axes
                                     name:(NSString* _Nullable)name;

// MPSGraphConvolutionOps.h
- (MPSGraphTensor*)convolution2DWithSourceTensor:(MPSGraphTensor*)source
                                   weightsTensor:(MPSGraphTensor*)weights
                                      descriptor:(MPSGraphConvolution2DOpDescriptor*)descriptor
                                            name:(NSString* _Nullable)name;
- (MPSGraphTensor*)convolution2DDataGradientWithIncomingGradientTensor:(MPSGraphTensor*)incomingGradient
                                                         weightsTensor:(MPSGraphTensor*)weights
                                                           outputShape:(MPSShape*)outputShape
                                          forwardConvolutionDescriptor:(MPSGraphConvolution2DOpDescriptor*)forwardConvolutionDescriptor
                                                                  name:(NSString* _Nullable)name;
- (MPSGraphTensor*)convolution2DWeightsGradientWithIncomingGradientTensor:(MPSGraphTensor*)incomingGradient
                                                             sourceTensor:(MPSGraphTensor*)source
                                                              outputShape:(MPSShape*)outputShape
                                             forwardConvolutionDescriptor:(MPSGraphConvolution2DOpDescriptor*)forwardConvolutionDescriptor
                                                                     name:(NSString* _Nullable)name;
- (MPSGraphTensor*)convolution3DWithSourceTensor:(MPSGraphTensor*)source
                                   weightsTensor:(MPSGraphTensor*)weights
                                      descriptor:(MPSGraphConvolution3DOpDescriptor*)descriptor
                                            name:(NSString* _Nullable)name API_AVAILABLE(macos(13.2));
- (MPSGraphTensor*)convolution3DDataGradientWithIncomingGradientTensor:(MPSGraphTensor*)incomingGradient
                                                         weightsTensor:(MPSGraphTensor*)weights
                                                           outputShape:(MPSShape*)outputShape
                                          forwardConvolutionDescriptor:(MPSGraphConvolution3DOpDescriptor*)forwardConvolutionDescriptor
                                                                  name:(NSString* _Nullable)name API_AVAILABLE(macos(13.2));
- (MPSGraphTensor*)convolution3DWeightsGradientWithIncomingGradientTensor:(MPSGraphTensor*)incomingGradient
                                                             sourceTensor:(MPSGraphTensor*)source
                                                              outputShape:(MPSShape*)outputShape
                                             forwardConvolutionDescriptor:(MPSGraphConvolution3DOpDescriptor*)forwardConvolutionDescriptor
                                                                     name:(NSString* _Nullable)name API_AVAILABLE(macos(13.2));
@end

NS_ASSUME_NONNULL_END
